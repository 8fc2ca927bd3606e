// agentd's live view (agentd.transport.ui_app, docs/operations.md "Watching a daemon in a browser").
//
// It follows the listener's /events WebSocket: `tree.node` messages are the run tree (status, steps, tokens,
// the tools in flight, elapsed time), `approval.waiting` / `approval.settled` are what waits for a person (a
// tool call to approve, a server's question: shown, never decided here), every other message is an event line. Every string the daemon sends
// (model and MCP server text included) goes into the page as text (textContent, with control and
// direction characters made visible), never as markup; the Content-Security-Policy allows this origin only.
// Drawing is coalesced into animation frames (none while the tab is hidden) and a once-a-second tick
// advances the elapsed time of running nodes; nothing else runs.
"use strict";

(() => {
  const MAX_NODES = 2000;        // nodes kept (the daemon's snapshot is 200)
  const LINES_PER_NODE = 50;     // recent lines kept per run node
  const LINES_ALL = 200;         // recent lines kept for the whole daemon
  const MAX_NESTING = 16;        // subagent.stderr relays nest one level per generation
  const FIELD_MAX = 300;         // characters of one field shown in an event line
  const RECONNECT_BASE = 0.5;    // seconds, doubling up to RECONNECT_CAP
  const RECONNECT_CAP = 10;
  const HIDDEN = new Set(["ts", "level", "event", "run_id", "pid", "comp", "agent_path"]);

  const nodes = new Map();       // "run_id#handle" -> {node, at: performance.now() when received, seq}
  const rows = new Map();        // "run_id#handle" -> <tr>
  const lines = new Map();       // "run_id#handle" -> [line, ...]
  const waiting = new Map();     // approval id -> {item: its approval.waiting message, at: performance.now()}
  const waitingRows = new Map(); // approval id -> <tr>
  const MAX_WAITING = 1000;      // items kept (the daemon sends each one once, and again on a reconnect)
  const allLines = [];
  let selected = null;
  let dropped = 0;
  let frame = 0;
  let attempt = 0;
  let seen = 0;                  // nodes in the order first seen: roots are drawn in that order

  const $ = (id) => document.getElementById(id);

  // -- text ------------------------------------------------------------------------------------------------

  function visible(text) {
    // C0/C1 controls, DEL and the direction overrides, as escapes: a server cannot reorder what a person reads.
    return String(text).replace(/[\u0000-\u001f\u007f-\u009f\u200e\u200f\u202a-\u202e\u2066-\u2069]/g,
      (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
  }

  function clip(text, max) {
    return text.length > max ? text.slice(0, max) + "…" : text;
  }

  function elapsed(seconds) {
    if (typeof seconds !== "number" || !isFinite(seconds)) return "";
    const s = Math.max(0, seconds);
    if (s < 60) return s.toFixed(1) + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + "m " + String(Math.floor(s % 60)).padStart(2, "0") + "s";
    return Math.floor(m / 60) + "h " + String(m % 60).padStart(2, "0") + "m";
  }

  function keyOf(runId, handle) {
    return String(runId ?? "").split("/")[0] + "#" + String(handle ?? "0");
  }

  function handleOrder(a, b) {
    const pa = String(a).split("."), pb = String(b).split(".");
    for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
      if (pa[i] === undefined) return -1;
      if (pb[i] === undefined) return 1;
      const na = Number(pa[i]), nb = Number(pb[i]);
      const c = Number.isInteger(na) && Number.isInteger(nb) ? na - nb : pa[i].localeCompare(pb[i]);
      if (c !== 0) return c;
    }
    return 0;
  }

  // -- taking messages -------------------------------------------------------------------------------------

  function unwrap(line) {
    // A subagent's own line arrives as its parent's subagent.stderr (nested once per level).
    for (let depth = 0; depth < MAX_NESTING && line.event === "subagent.stderr"; depth++) {
      if (typeof line.line !== "string" || !line.line.startsWith("{")) break;
      let inner;
      try { inner = JSON.parse(line.line); } catch (e) { break; }
      if (inner === null || typeof inner !== "object" || Array.isArray(inner)) break;
      line = inner;
    }
    return line;
  }

  function take(message) {
    if (message.event === "tree.node" && typeof message.handle === "string") {
      const key = keyOf(message.run_id, message.handle);
      const before = nodes.get(key);
      nodes.delete(key);  // re-inserted last: the most recently changed nodes are the ones kept
      nodes.set(key, {node: message, at: performance.now(), seq: before === undefined ? ++seen : before.seq});
      while (nodes.size > MAX_NODES) {
        const oldest = nodes.keys().next().value;
        nodes.delete(oldest);
        lines.delete(oldest);
      }
    } else if (message.event === "approval.waiting" && typeof message.id === "string") {
      waiting.set(message.id, {item: message, at: performance.now()});
      while (waiting.size > MAX_WAITING) waiting.delete(waiting.keys().next().value);
    } else if (message.event === "approval.settled" && typeof message.id === "string") {
      waiting.delete(message.id);
    } else if (message.event === "stream.dropped") {
      dropped += Number(message.count) || 0;
    } else {
      const line = unwrap(message);
      const text = describe(line);
      const level = typeof line.level === "string" ? line.level : "info";
      const entry = {text, level};
      push(allLines, entry, LINES_ALL);
      const key = keyOf(line.run_id, line.agent_path);
      let mine = lines.get(key);
      if (mine === undefined) {
        mine = [];
        lines.set(key, mine);
        if (lines.size > MAX_NODES) lines.delete(lines.keys().next().value);
      }
      push(mine, entry, LINES_PER_NODE);
    }
    schedule();
  }

  function push(list, item, max) {
    list.push(item);
    if (list.length > max) list.splice(0, list.length - max);
  }

  function describe(line) {
    const ts = typeof line.ts === "string" ? line.ts.slice(11, 23) : "";
    const fields = [];
    for (const [name, value] of Object.entries(line)) {
      if (HIDDEN.has(name)) continue;
      const shown = typeof value === "string" ? value : JSON.stringify(value);
      fields.push(name + "=" + clip(String(shown), FIELD_MAX));
    }
    const where = line.agent_path !== undefined ? " [" + line.agent_path + "]" : "";
    return visible(ts + " " + String(line.event) + where + " " + fields.join(" "));
  }

  // -- drawing ---------------------------------------------------------------------------------------------

  function schedule() {
    if (frame === 0) frame = requestAnimationFrame(draw);
  }

  function ordered() {
    const children = new Map();
    const roots = [];
    for (const [key, {node}] of nodes) {
      const parent = node.parent == null ? null : keyOf(node.run_id, node.parent);
      if (parent !== null && nodes.has(parent)) {
        if (!children.has(parent)) children.set(parent, []);
        children.get(parent).push(key);
      } else {
        roots.push(key);
      }
    }
    const out = [];
    const walk = (key, depth) => {
      out.push([key, depth]);
      const mine = children.get(key) || [];
      mine.sort((a, b) => handleOrder(nodes.get(a).node.handle, nodes.get(b).node.handle));
      for (const child of mine) walk(child, depth + 1);
    };
    roots.sort((a, b) => nodes.get(a).seq - nodes.get(b).seq);
    for (const key of roots) walk(key, 0);
    return out;
  }

  function cell(tr, index) {
    return tr.children[index];
  }

  function setText(element, text) {
    if (element.textContent !== text) element.textContent = text;
  }

  function rowFor(key) {
    let tr = rows.get(key);
    if (tr === undefined) {
      tr = document.createElement("tr");
      for (const name of ["handle", "status", "steps num", "tokens num", "tool", "elapsed num"]) {
        const td = document.createElement("td");
        td.className = name;
        tr.appendChild(td);
      }
      tr.addEventListener("click", () => {
        selected = selected === key ? null : key;
        schedule();
      });
      rows.set(key, tr);
    }
    return tr;
  }

  function elapsedOf(entry, now) {
    const {node, at} = entry;
    if (typeof node.elapsed_s !== "number") return null;
    return node.status === "running" ? node.elapsed_s + (now - at) / 1000 : node.elapsed_s;
  }

  function draw() {
    frame = 0;
    const now = performance.now();
    const body = $("nodes");
    const order = ordered();
    const shown = new Set();
    let running = 0;
    order.forEach(([key, depth], index) => {
      const entry = nodes.get(key);
      const node = entry.node;
      const tr = rowFor(key);
      shown.add(key);
      tr.dataset.handle = visible(node.handle);
      tr.dataset.status = visible(node.status);
      tr.setAttribute("aria-selected", String(key === selected));
      const status = visible(node.status ?? "");
      if (status === "running") running += 1;
      setText(cell(tr, 0), "\u00a0\u00a0".repeat(depth) + visible(node.handle));
      setText(cell(tr, 1), status);
      cell(tr, 1).className = "status st-" + status.replace(/[^a-z_]/g, "");
      setText(cell(tr, 2), String(Number(node.steps) || 0));
      setText(cell(tr, 3), String(Number(node.tokens) || 0));
      const tools = Array.isArray(node.tools) ? node.tools.map(visible).join(", ") : "";
      setText(cell(tr, 4), tools);
      setText(cell(tr, 5), elapsed(elapsedOf(entry, now)));
      if (body.children[index] !== tr) body.insertBefore(tr, body.children[index] || null);
    });
    for (const [key, tr] of rows) {
      if (!shown.has(key)) {
        tr.remove();
        rows.delete(key);
      }
    }
    if (selected !== null && !nodes.has(selected)) selected = null;
    $("empty").hidden = order.length > 0;
    setText($("summary"), order.length + " runs, " + running + " running"
      + (dropped ? ", " + dropped + " lines dropped (the page fell behind)" : ""));
    drawWaiting(now);
    drawLines();
  }

  function summaryOf(item) {
    if (item.kind === "elicitation") {
      const schema = item.schema !== null && typeof item.schema === "object" ? item.schema : {};
      const props = schema.properties !== null && typeof schema.properties === "object" ? schema.properties : {};
      const fields = Object.keys(props).slice(0, 32).join(", ");
      return String(item.message ?? "") + (fields ? " (fields: " + fields + ")" : "");
    }
    const args = item.arguments !== null && typeof item.arguments === "object" ? item.arguments : {};
    return Object.entries(args).map(([name, value]) =>
      name + "=" + (typeof value === "string" ? value : JSON.stringify(value))).join(", ");
  }

  function drawWaiting(now) {
    const body = $("pending");
    const ids = [...waiting.keys()];
    ids.forEach((id, index) => {
      const {item, at} = waiting.get(id);
      let tr = waitingRows.get(id);
      if (tr === undefined) {
        tr = document.createElement("tr");
        for (const name of ["id", "what", "run", "details", "waited num"]) {
          const td = document.createElement("td");
          td.className = name;
          tr.appendChild(td);
        }
        waitingRows.set(id, tr);
      }
      tr.dataset.id = visible(id);
      setText(cell(tr, 0), visible(id));
      setText(cell(tr, 1), visible(item.kind === "elicitation" ? "question from " + String(item.server ?? "")
        : String(item.tool ?? "")));
      setText(cell(tr, 2), visible(String(item.run_id ?? "") + (item.agent_path ? " [" + item.agent_path + "]" : "")));
      setText(cell(tr, 3), visible(clip(summaryOf(item), FIELD_MAX * 2)));
      const base = typeof item.waiting_s === "number" ? item.waiting_s : 0;
      setText(cell(tr, 4), elapsed(base + (now - at) / 1000));
      if (body.children[index] !== tr) body.insertBefore(tr, body.children[index] || null);
    });
    for (const [id, tr] of waitingRows) {
      if (!waiting.has(id)) {
        tr.remove();
        waitingRows.delete(id);
      }
    }
    $("people").hidden = waiting.size === 0;
  }

  function drawLines() {
    const list = selected === null ? allLines : (lines.get(selected) || []);
    const of = selected === null ? "(all)" : "of " + visible(nodes.get(selected).node.handle);
    setText($("lines-of"), of);
    const ol = $("lines");
    const items = list.slice(-LINES_PER_NODE).reverse();
    while (ol.children.length > items.length) ol.lastChild.remove();
    items.forEach((item, index) => {
      let li = ol.children[index];
      if (li === undefined) {
        li = document.createElement("li");
        ol.appendChild(li);
      }
      setText(li, item.text);
      li.className = item.level === "warn" || item.level === "error" ? item.level : "";
    });
  }

  function tick() {
    // Elapsed time moves for running nodes and waiting items only; an idle or hidden page draws nothing.
    if (waiting.size > 0) return schedule();
    for (const {node} of nodes.values()) {
      if (node.status === "running") return schedule();
    }
  }

  // -- the connection --------------------------------------------------------------------------------------

  function status(state, text) {
    const element = $("status");
    element.dataset.state = state;
    setText(element, text);
  }

  function connect() {
    const url = new URL("../events", location.href);  // relative: a proxy may serve the daemon under a prefix
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    status("connecting", "connecting");
    const socket = new WebSocket(url.href);
    let opened = false;
    socket.addEventListener("open", () => {
      opened = true;
      attempt = 0;
      nodes.clear();  // the daemon sends its snapshot first: what was drawn before may be stale
      waiting.clear();  // and what waits now
      status("connected", "connected");
      schedule();
    });
    socket.addEventListener("message", (event) => {
      if (typeof event.data !== "string") return;
      let message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      if (message !== null && typeof message === "object" && !Array.isArray(message)) take(message);
    });
    socket.addEventListener("close", (event) => {
      attempt += 1;
      const delay = Math.min(RECONNECT_CAP, RECONNECT_BASE * 2 ** (attempt - 1));
      const why = opened ? (event.code === 1001 ? "the daemon is stopping" : "connection lost")
        : "refused or unreachable (reload the page to log in again; a refusal is a serve.refused line on the daemon)";
      status("disconnected", "disconnected: " + why + "; retrying in " + delay.toFixed(1) + " s");
      setTimeout(connect, delay * 1000);
    });
  }

  setInterval(tick, 1000);
  connect();
})();
