"""The gateway client against the scripted gateway, over real sockets on 127.0.0.1."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from agentd.errors import ConfigError, IntelligenceError
from agentd.intelligence import ChatTool, GatewayError, ToolCall, Usage, open_intelligence
from agentd.security.secrets import SecretResolver
from agentd.telemetry.events import EventLog
from tests.peers.gateway import closed_port, malformed, scripted_gateway, status, text, tool_call

TOKEN = "sk-test-7f3a9b2c4d5e6f708192a3b4"
USER = [{"role": "user", "content": "do the thing"}]
TOOLS = [ChatTool("srv__echo", "echo text", {"type": "object", "properties": {"text": {"type": "string"}}})]


def capture(**options: Any) -> tuple[EventLog, list[dict[str, Any]]]:
    lines: list[dict[str, Any]] = []
    return EventLog(sink=lines.append, level="debug", **options), lines


def events(lines: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["event"] == name]


async def test_plain_reply_and_request_shape() -> None:
    log, lines = capture()
    async with scripted_gateway([text("done", usage={"prompt_tokens": 21, "completion_tokens": 3})]) as gw:
        async with open_intelligence([gw.url], model="gpt-4o", log=log) as intel:
            with trio.fail_after(10):
                reply = await intel.complete(USER, TOOLS)
    assert reply.content == "done"
    assert reply.tool_calls == ()
    assert reply.usage == Usage(21, 3)
    assert reply.finish_reason == "stop"
    (request,) = gw.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["content-type"] == "application/json"
    assert "authorization" not in request.headers
    assert request.body["model"] == "gpt-4o"
    assert request.body["messages"] == USER
    assert request.body["tool_choice"] == "auto"
    assert request.body["max_tokens"] == 4096
    assert request.body["tools"][0]["function"]["name"] == "srv__echo"
    assert "stream" not in request.body
    (call,) = events(lines, "intel.call")
    assert call["comp"] == "intelligence" and call["messages"] == 1 and call["tools"] == 1
    assert isinstance(call["body"], int)  # a length, not the body
    (result,) = events(lines, "intel.result")
    assert result["prompt_tokens"] == 21 and result["content"] == 4


async def test_tool_calls_parsed_and_usage_accumulated() -> None:
    log, _ = capture()
    replies = [tool_call("srv__echo", {"text": "hi"}, id="call_a"), text("ok")]
    async with scripted_gateway(replies) as gw, open_intelligence(gw.url, log=log) as intel:
        first = await intel.complete(USER, TOOLS)
        second = await intel.complete(USER, TOOLS)
    assert first.tool_calls == (ToolCall("call_a", "srv__echo", '{"text": "hi"}'),)
    assert first.finish_reason == "tool_calls"
    assert json.loads(first.tool_calls[0].arguments) == {"text": "hi"}
    assert second.content == "ok"
    assert intel.usage == Usage(20, 10)


async def test_streaming_reply_assembles_fragments() -> None:
    log, _ = capture()
    arguments = {"text": "a longer argument, split into many fragments", "n": 3}
    replies = [
        {
            "content": "let me call",
            "tool_calls": [{"name": "srv__echo", "arguments": arguments, "id": "c9"}],
            "chunk": 4,
            "usage": {"prompt_tokens": 33, "completion_tokens": 12},
        },
        text("final answer in pieces", chunk=2),
    ]
    async with scripted_gateway(replies) as gw, open_intelligence([gw.url], stream=True, log=log) as intel:
        first = await intel.complete(USER, TOOLS)
        second = await intel.complete(USER, TOOLS)
    assert first.content == "let me call"
    assert first.tool_calls == (ToolCall("c9", "srv__echo", json.dumps(arguments)),)
    assert first.usage == Usage(33, 12)
    assert second.content == "final answer in pieces"
    assert second.finish_reason == "stop"
    request = gw.requests[0]
    assert request.body["stream"] is True
    assert request.body["stream_options"] == {"include_usage": True}
    assert "text/event-stream" in request.headers["accept"]


async def test_stream_request_answered_with_plain_json_still_works() -> None:
    log, _ = capture()
    async with scripted_gateway([text("plain", stream=False)]) as gw:
        async with open_intelligence([gw.url], stream=True, log=log) as intel:
            assert (await intel.complete(USER, [])).content == "plain"


async def test_429_then_success_honours_retry_after(autojump_clock: trio.abc.Clock) -> None:
    log, lines = capture()
    async with scripted_gateway([status(429, retry_after=2), text("after the wait")]) as gw:
        async with open_intelligence([gw.url], log=log) as intel:
            start = trio.current_time()
            with trio.fail_after(30):
                reply = await intel.complete(USER, [])
            waited = trio.current_time() - start
    assert reply.content == "after the wait"
    assert len(gw.requests) == 2
    assert 2.0 <= waited < 2.5
    (retry,) = events(lines, "intel.retry")
    assert retry["status"] == 429 and retry["delay_s"] >= 2.0 and retry["attempt"] == 1


async def test_retry_backoff_is_jittered_250_then_500_ms(autojump_clock: trio.abc.Clock) -> None:
    log, lines = capture()
    async with scripted_gateway([status(500), status(503), text("third time")]) as gw:
        async with open_intelligence([gw.url], log=log) as intel:
            with trio.fail_after(30):
                assert (await intel.complete(USER, [])).content == "third time"
    delays = [line["delay_s"] for line in events(lines, "intel.retry")]
    assert len(delays) == 2
    assert 0.2 <= delays[0] <= 0.3
    assert 0.4 <= delays[1] <= 0.6
    assert events(lines, "intel.failover") == []


async def test_retry_delays_and_breaker_cooldowns_are_the_backoff_formula(autojump_clock: trio.abc.Clock) -> None:
    from agentd.backoff import exponential
    from agentd.intelligence.failover import JITTER, RETRIES, RETRY_BASE, RETRY_CAP, Breaker

    log, lines = capture()
    async with scripted_gateway([*[status(503)] * RETRIES, text("made it")]) as gw:
        async with open_intelligence([gw.url], log=log) as intel:
            with trio.fail_after(30):
                assert (await intel.complete(USER, [])).content == "made it"
    delays = [line["delay_s"] for line in events(lines, "intel.retry")]
    assert len(delays) == RETRIES
    for n, delay in enumerate(delays, start=1):
        expected = exponential(n, RETRY_BASE, RETRY_CAP)
        assert expected * (1 - JITTER) - 0.001 <= delay <= expected * (1 + JITTER) + 0.001
    # A breaker's n-th opening since its last success waits exponential(n, initial, maximum), for any
    # parameters; a success starts again from the bottom.
    breaker = Breaker(threshold=1, initial=1.5, maximum=7.0)
    cooldowns = []
    for _ in range(6):
        assert breaker.failure()
        cooldowns.append(breaker.cooldown)
    assert cooldowns == [exponential(n, 1.5, 7.0) for n in range(1, 7)] == [1.5, 3.0, 6.0, 7.0, 7.0, 7.0]
    breaker.success()
    breaker.failure()
    assert breaker.cooldown == 1.5


async def test_5xx_retries_then_failover_with_one_endpoint_down(autojump_clock: trio.abc.Clock) -> None:
    log, lines = capture()
    down = f"http://127.0.0.1:{closed_port()}/v1"
    async with (
        scripted_gateway(default=status(502)) as bad,
        scripted_gateway(default=text("from the third")) as good,
    ):
        async with open_intelligence([down, bad.url, good.url], log=log) as intel:
            with trio.fail_after(30):
                reply = await intel.complete(USER, [])
            assert reply.content == "from the third"
            assert len(bad.requests) == 3  # one attempt and two retries
            assert len(good.requests) == 1
            failovers = events(lines, "intel.failover")
            assert [f["endpoint"] for f in failovers] == [bad.completions_url, good.completions_url]
            assert "refused" in failovers[0]["reason"] and failovers[1]["reason"] == "HTTP 502"
            assert len(events(lines, "intel.retry")) == 4
            # The endpoint that answered is now sticky: the next call goes straight to it.
            with trio.fail_after(30):
                await intel.complete(USER, [])
            assert len(good.requests) == 2 and len(bad.requests) == 3


async def test_all_endpoints_down_is_intelligence_error(autojump_clock: trio.abc.Clock) -> None:
    log, lines = capture()
    urls = [f"http://127.0.0.1:{closed_port()}/v1", f"http://127.0.0.1:{closed_port()}"]
    async with open_intelligence(urls, log=log) as intel:
        with trio.fail_after(30), pytest.raises(IntelligenceError) as info:
            await intel.complete(USER, [])
    assert info.value.exit_code == 4
    assert "all 2 intelligence endpoints are unavailable" in str(info.value)
    assert len(events(lines, "intel.error")) == 1


async def test_breaker_opens_half_opens_and_closes(autojump_clock: trio.abc.Clock) -> None:
    log, lines = capture()
    async with scripted_gateway(default=status(500)) as gw, open_intelligence([gw.url], log=log) as intel:

        async def call() -> bool:
            with trio.fail_after(300):
                try:
                    await intel.complete(USER, [])
                except IntelligenceError:
                    return False
            return True

        assert not await call()
        assert len(gw.requests) == 3
        opened_at = trio.current_time()
        breaker = intel.breakers[0]  # type: ignore[attr-defined]
        assert breaker.state.value == "open" and breaker.cooldown == 5.0
        # While open, nothing is sent.
        assert not await call()
        await trio.sleep(4.9)
        assert not await call()
        assert len(gw.requests) == 3
        # After the cooldown, exactly one probe (no retries); it fails, the cooldown doubles.
        await trio.sleep(0.2)
        assert not await call()
        assert len(gw.requests) == 4
        assert breaker.cooldown == 10.0
        assert trio.current_time() - opened_at < 5.5
        await trio.sleep(9.9)
        assert not await call()
        assert len(gw.requests) == 4
        await trio.sleep(0.2)
        gw.script.default = text("recovered")
        assert await call()
        assert len(gw.requests) == 5
        assert breaker.state.value == "closed" and breaker.cooldown == 0.0
        states = [line["state"] for line in events(lines, "intel.breaker")]
        assert states.count("open") == 2 and "half_open" in states and states[-1] == "closed"
        # The cooldown grows to at most 60 s.
        gw.script.default = status(500)
        assert not await call()
        for expected in (10.0, 20.0, 40.0, 60.0, 60.0):
            await trio.sleep(breaker.open_until - trio.current_time())
            assert not await call()
            assert breaker.cooldown == expected


async def test_401_is_fatal_and_never_leaks_the_token() -> None:
    log, lines = capture(log_content=True)
    resolver = SecretResolver(env={"GW_TOKEN": TOKEN}, redactor=log.redactor)
    reply = status(401, message=f"invalid api key {TOKEN}")
    async with scripted_gateway([reply], default=text("never")) as gw:
        async with open_intelligence(
            [gw.url], token="{{secret:GW_TOKEN}}", log=log, secrets=resolver
        ) as intel:
            with trio.fail_after(10), pytest.raises(IntelligenceError) as info:
                await intel.complete(USER, [])
    assert isinstance(info.value, GatewayError) and info.value.status == 401
    assert info.value.exit_code == 4
    assert "credentials" in str(info.value) and "401" in str(info.value)
    assert TOKEN not in str(info.value)
    assert len(gw.requests) == 1  # no retry can fix authentication
    assert gw.requests[0].headers["authorization"] == f"Bearer {TOKEN}"
    assert TOKEN not in json.dumps(lines)
    assert events(lines, "intel.error")


async def test_token_from_a_secret_file_without_a_resolver(tmp_path: Any) -> None:
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    log, lines = capture(log_content=True)
    async with scripted_gateway([text(f"echo {TOKEN}")]) as gw:
        async with open_intelligence([gw.url], token=f"{{{{secret-file:{secret}}}}}", log=log) as intel:
            await intel.complete([{"role": "user", "content": "hi"}], [])
    assert gw.requests[0].headers["authorization"] == f"Bearer {TOKEN}"
    assert TOKEN not in json.dumps(lines)  # even content logging is scrubbed


async def test_literal_token_and_bad_endpoint_are_config_errors() -> None:
    log, _ = capture()
    with pytest.raises(ConfigError) as info:
        async with open_intelligence(["http://127.0.0.1:1/v1"], token=TOKEN, log=log):
            pass
    assert TOKEN not in str(info.value)
    with pytest.raises(ConfigError):
        async with open_intelligence(["http://gateway.example/v1"], log=log):
            pass


@pytest.mark.parametrize(
    "reply",
    [
        malformed(),
        malformed("<html>bad gateway page</html>", content_type="text/html"),
        {"json": {"choices": []}},
        {"json": {"error": {"message": "model overloaded"}}},
        {"raw": "data: {not json}\n\n", "content_type": "text/event-stream"},
    ],
)
async def test_malformed_replies_are_fatal(reply: dict[str, Any]) -> None:
    log, lines = capture()
    async with (
        scripted_gateway([reply], default=text("never")) as gw,
        open_intelligence([gw.url], log=log) as intel,
    ):
        with trio.fail_after(10), pytest.raises(IntelligenceError) as info:
            await intel.complete(USER, [])
    assert "malformed" in str(info.value) or "error object" in str(info.value)
    assert len(gw.requests) == 1
    assert events(lines, "intel.error")


async def test_other_4xx_is_fatal_with_the_gateway_message() -> None:
    log, _ = capture()
    async with scripted_gateway([status(400, message="unknown model 'nope'")]) as gw:
        async with open_intelligence([gw.url], log=log) as intel:
            with pytest.raises(GatewayError) as info:
                await intel.complete(USER, [])
    assert info.value.status == 400 and "unknown model 'nope'" in str(info.value)


async def test_timeout_is_retried_then_fails(autojump_clock: trio.abc.Clock) -> None:
    log, lines = capture()
    async with scripted_gateway(default={"delay": 1000, "content": "too late"}) as gw:
        async with open_intelligence([gw.url], log=log, timeout=120) as intel:
            start = trio.current_time()
            with trio.fail_after(1000), pytest.raises(IntelligenceError):
                await intel.complete(USER, [])
            elapsed = trio.current_time() - start
    assert len(gw.requests) == 3
    assert 360 <= elapsed < 362
    assert all("120 s" in line["reason"] for line in events(lines, "intel.retry"))


@pytest.mark.parametrize(
    ("cut", "reason"), [(True, "cut off mid-event"), ("event", "before the reply was complete")]
)
async def test_cut_stream_is_retried(autojump_clock: trio.abc.Clock, cut: object, reason: str) -> None:
    log, lines = capture()
    replies = [text("this stream breaks off half way", cut=cut), text("whole")]
    async with scripted_gateway(replies) as gw, open_intelligence([gw.url], stream=True, log=log) as intel:
        with trio.fail_after(30):
            assert (await intel.complete(USER, [])).content == "whole"
    assert len(gw.requests) == 2
    assert reason in events(lines, "intel.retry")[0]["reason"]


async def test_long_retry_after_moves_on_at_once(autojump_clock: trio.abc.Clock) -> None:
    log, _ = capture()
    async with scripted_gateway(default=status(429, retry_after=3600)) as busy:
        async with scripted_gateway([text("other")]) as other:
            async with open_intelligence([busy.url, other.url], log=log) as intel:
                start = trio.current_time()
                assert (await intel.complete(USER, [])).content == "other"
                assert trio.current_time() - start < 1
    assert len(busy.requests) == 1


async def test_url_already_ending_in_chat_completions_is_used_verbatim() -> None:
    log, _ = capture()
    async with scripted_gateway([text("ok")]) as gw:
        async with open_intelligence([gw.completions_url], log=log) as intel:
            await intel.complete(USER, [])
    assert gw.requests[0].path == "/v1/chat/completions"


async def test_cancellation_propagates_promptly() -> None:
    log, _ = capture()
    async with scripted_gateway(default={"delay": 60, "content": "late"}) as gw:
        async with open_intelligence([gw.url], log=log) as intel:
            with trio.move_on_after(0.2) as scope:
                await intel.complete(USER, [])
    assert scope.cancelled_caught


async def test_rotated_token_is_picked_up_after_a_401(tmp_path: Any) -> None:
    secret = tmp_path / "token"
    secret.write_text("old-token-value")
    log, lines = capture()
    accepted = {"Bearer new-token-value"}

    def gate(request: Any) -> dict[str, Any]:
        return text("welcome") if request.headers.get("authorization") in accepted else status(401)

    async with scripted_gateway(default=gate) as gw:
        async with open_intelligence([gw.url], token=f"{{{{secret-file:{secret}}}}}", log=log) as intel:
            secret.write_text("new-token-value")
            with trio.fail_after(10):
                assert (await intel.complete(USER, [])).content == "welcome"
            # Revoked, and the rotated value is wrong too: one re-read, one retry, then the error.
            accepted.clear()
            secret.write_text("wrong-token-value")
            with trio.fail_after(10), pytest.raises(GatewayError):
                await intel.complete(USER, [])
    assert [r.headers["authorization"].removeprefix("Bearer ") for r in gw.requests] == [
        "old-token-value",
        "new-token-value",
        "new-token-value",
        "wrong-token-value",
    ]
    dumped = json.dumps(lines)
    assert "token-value" not in dumped


async def test_https_gateway_with_a_private_ca(tmp_path: Any) -> None:
    from tests.selfmcp.certs import make_pki

    pki = make_pki(tmp_path / "pki")
    log, _ = capture()
    async with scripted_gateway(
        [text("over tls")], certfile=str(pki.server.cert), keyfile=str(pki.server.key)
    ) as gw:
        assert gw.url.startswith("https://127.0.0.1:")
        async with open_intelligence([gw.url], log=log, verify=pki.client_context()) as intel:
            with trio.fail_after(10):
                assert (await intel.complete(USER, [])).content == "over tls"
        # Without the CA the certificate is not trusted: a transport failure, never a silent downgrade.
        async with open_intelligence([gw.url], log=log) as untrusting:
            with trio.fail_after(30), pytest.raises(IntelligenceError) as info:
                await untrusting.complete(USER, [])
    assert "certificate verification failed" in str(info.value)
    assert len(gw.requests) == 1


async def test_scripted_gateway_echo_and_wait_for() -> None:
    async with scripted_gateway(default={"echo_last": True}) as gw:
        async with open_intelligence([gw.url], log=capture()[0]) as intel, trio.open_nursery() as nursery:
            answers: list[str | None] = []

            async def ask(text_: str) -> None:
                answers.append((await intel.complete([{"role": "tool", "content": text_}], [])).content)

            nursery.start_soon(ask, "observed 1")
            nursery.start_soon(ask, "observed 2")
            with trio.fail_after(10):
                await gw.wait_for(2)
    assert sorted(a or "" for a in answers) == ["observed 1", "observed 2"]


async def test_rotation_on_the_last_attempt_still_gets_its_retry(
    tmp_path: Any, autojump_clock: trio.abc.Clock
) -> None:
    secret = tmp_path / "token"
    secret.write_text("first-token-value")
    log, _ = capture()

    def gate(request: Any) -> dict[str, Any]:
        return text("in") if request.headers["authorization"] == "Bearer second-token-value" else status(401)

    async with scripted_gateway([status(500), status(503)], default=gate) as gw:
        async with open_intelligence([gw.url], token=f"{{{{secret-file:{secret}}}}}", log=log) as intel:
            secret.write_text("second-token-value")
            with trio.fail_after(30):
                assert (await intel.complete(USER, [])).content == "in"
    assert len(gw.requests) == 4


@pytest.mark.parametrize(("code", "hint"), [(404, "base URL"), (307, "redirects are not followed")])
async def test_wrong_place_errors_say_what_to_fix(code: int, hint: str) -> None:
    async with scripted_gateway([status(code, headers={"Location": "https://elsewhere.example/"})]) as gw:
        async with open_intelligence([gw.url], log=capture()[0]) as intel:
            with pytest.raises(GatewayError) as info:
                await intel.complete(USER, [])
    assert info.value.status == code and hint in str(info.value)
