"""Drive a running ``schedkit serve``: send generation requests and control messages on one
DEALER socket and print what comes back on it (only this client's own outputs).

    schedkit serve wiring.yaml -o examples/serve.yaml &
    python examples/send_requests.py -n 8
    python examples/send_requests.py --control get_loads
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import msgspec
import zmq

from schedkit.components.io.io_struct import (
    BatchTokenIDOutput,
    ControlReply,
    ControlReq,
    ErrorReply,
    GenerateReqInput,
    SamplingParamsInput,
    decode_server_message,
    encode,
)


class Client:
    """A DEALER connected to the server's ROUTER: requests out, this client's messages in."""

    def __init__(self, endpoint: str, context: zmq.Context | None = None) -> None:
        self.context = context or zmq.Context.instance()
        self.dealer = self.context.socket(zmq.DEALER)
        self.dealer.connect(endpoint)
        self.errors: list[ErrorReply] = []
        self._replies: list[ControlReply] = []
        self._outputs: list[BatchTokenIDOutput] = []

    def generate(
        self, rid: str, input_ids: list[int], max_new_tokens: int, stream: bool = True
    ) -> None:
        params = SamplingParamsInput(max_new_tokens=max_new_tokens, stream=stream)
        self.dealer.send(
            encode(GenerateReqInput(rid=rid, input_ids=input_ids, sampling_params=params))
        )

    def _receive(self, timeout: float) -> bool:
        """Read one message into the right list; False if none came within ``timeout``."""
        if not self.dealer.poll(max(1, int(timeout * 1000))):
            return False
        msg = decode_server_message(self.dealer.recv())
        if isinstance(msg, ControlReply):
            self._replies.append(msg)
        elif isinstance(msg, ErrorReply):
            self.errors.append(msg)
        elif isinstance(msg, BatchTokenIDOutput):
            self._outputs.append(msg)
        return True

    def control(
        self, kind: str, mode: str = "retract", timeout: float = 5.0, token: str | None = None
    ) -> ControlReply:
        """Send a control message (``token``: the server's admin token, which pause, continue
        and flush need) and wait for its reply."""
        self.dealer.send(encode(ControlReq(type=kind, mode=mode, token=token)))
        deadline = time.monotonic() + timeout
        while not self._replies:
            if not self._receive(deadline - time.monotonic()):
                raise TimeoutError(f"no reply to {kind!r} within {timeout} s")
        return self._replies.pop(0)

    def collect(self, rids: set[str], timeout: float = 30.0) -> dict[str, dict]:
        """Gather streamed outputs until every rid in ``rids`` finished or was refused."""
        results = {rid: {"tokens": [], "finish": None, "messages": 0} for rid in rids}
        pending = set(rids)
        deadline = time.monotonic() + timeout
        while pending:
            while self._outputs:
                msg = self._outputs.pop(0)
                for i, rid in enumerate(msg.rids):
                    entry = results[rid]
                    entry["tokens"] += msg.output_ids[i]
                    entry["messages"] += 1
                    if msg.finished_reasons[i] is not None:
                        entry["finish"] = msgspec.to_builtins(msg.finished_reasons[i])
                        entry["cached_tokens"] = msg.cached_tokens[i]
                        pending.discard(rid)
            for error in self.errors:
                if error.rid in pending:
                    results[error.rid]["error"] = error.message
                    pending.discard(error.rid)
            if pending and not self._receive(deadline - time.monotonic()):
                raise TimeoutError(f"{len(pending)} requests unfinished after {timeout} s")
        return results

    def close(self) -> None:
        self.dealer.close(linger=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--endpoint", default="tcp://127.0.0.1:30010")
    parser.add_argument("-n", "--num-requests", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--control", choices=["pause", "continue", "flush", "get_loads"])
    parser.add_argument("--mode", default="retract", choices=["retract", "in_place"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--admin-token",
        default=os.environ.get("SCHEDKIT_ADMIN_TOKEN"),
        help="the server's admin token, for pause, continue and flush",
    )
    args = parser.parse_args(argv)
    client = Client(args.endpoint)
    try:
        if args.control:
            print(
                json.dumps(
                    msgspec.to_builtins(
                        client.control(args.control, args.mode, token=args.admin_token)
                    )
                )
            )
            return 0
        rng = random.Random(args.seed)
        shared = [rng.randrange(10, 32000) for _ in range(64)]
        rids = set()
        for i in range(args.num_requests):
            rid = f"client-{args.seed}-{i}"
            client.generate(
                rid, shared + [rng.randrange(10, 32000) for _ in range(16)], args.max_new_tokens
            )
            rids.add(rid)
        for rid, result in sorted(client.collect(rids).items()):
            print(json.dumps({"rid": rid, **result}))
        return 0
    except TimeoutError as exc:
        print(f"send_requests: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
