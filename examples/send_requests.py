"""Drive a running ``schedkit serve``: send generation requests and control messages, print
what comes back.

    schedkit serve wiring.yaml -o examples/serve.yaml &
    python examples/send_requests.py -n 8
    python examples/send_requests.py --control get_loads
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import msgspec
import zmq
from schedkit.components.io_struct import (
    BatchTokenIDOutput,
    ControlReply,
    ControlReq,
    GenerateReqInput,
    SamplingParamsInput,
    decode_output,
    decode_reply,
    encode,
)


class Client:
    """A DEALER to the scheduler's request socket and a PULL from its output socket."""

    def __init__(self, requests: str, outputs: str, context: zmq.Context | None = None) -> None:
        self.context = context or zmq.Context.instance()
        self.dealer = self.context.socket(zmq.DEALER)
        self.dealer.connect(requests)
        self.pull = self.context.socket(zmq.PULL)
        self.pull.connect(outputs)

    def generate(
        self, rid: str, input_ids: list[int], max_new_tokens: int, stream: bool = True
    ) -> None:
        params = SamplingParamsInput(max_new_tokens=max_new_tokens, stream=stream)
        self.dealer.send(
            encode(GenerateReqInput(rid=rid, input_ids=input_ids, sampling_params=params))
        )

    def control(self, kind: str, mode: str = "retract", timeout: float = 5.0) -> ControlReply:
        """Send a control message and wait for its reply."""
        self.dealer.send(encode(ControlReq(type=kind, mode=mode)))
        if not self.dealer.poll(int(timeout * 1000)):
            raise TimeoutError(f"no reply to {kind!r} within {timeout} s")
        return decode_reply(self.dealer.recv())

    def collect(self, rids: set[str], timeout: float = 30.0) -> dict[str, dict]:
        """Gather streamed outputs until every rid in ``rids`` finished."""
        results = {rid: {"tokens": [], "finish": None, "messages": 0} for rid in rids}
        pending = set(rids)
        deadline = time.monotonic() + timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0 or not self.pull.poll(int(left * 1000)):
                raise TimeoutError(f"{len(pending)} requests unfinished after {timeout} s")
            msg = decode_output(self.pull.recv())
            if not isinstance(msg, BatchTokenIDOutput):
                continue
            for i, rid in enumerate(msg.rids):
                if rid not in results:
                    continue
                entry = results[rid]
                entry["tokens"] += msg.output_ids[i]
                entry["messages"] += 1
                if msg.finished_reasons[i] is not None:
                    entry["finish"] = msgspec.to_builtins(msg.finished_reasons[i])
                    entry["cached_tokens"] = msg.cached_tokens[i]
                    pending.discard(rid)
        return results

    def close(self) -> None:
        self.dealer.close(linger=0)
        self.pull.close(linger=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="tcp://127.0.0.1:30010")
    parser.add_argument("--outputs", default="tcp://127.0.0.1:30011")
    parser.add_argument("-n", "--num-requests", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--control", choices=["pause", "continue", "flush", "get_loads"])
    parser.add_argument("--mode", default="retract", choices=["retract", "in_place"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    client = Client(args.requests, args.outputs)
    try:
        if args.control:
            print(json.dumps(msgspec.to_builtins(client.control(args.control, args.mode))))
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
