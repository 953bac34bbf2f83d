#!/usr/bin/env python3
"""A PyTorch-style training loop that survives slurmgpu taking its node away.

slurmgpu tells a job to checkpoint in two ways (see docs/user-guide.md):
  * a signal (SIGUSR1 by default) to the batch script, and
  * a request file at $SLURMGPU_CHECKPOINT_FILE (exported by slurmgpu's TaskProlog).

This loop does what a real one should:
  1. at start, resume from its last checkpoint if there is one (a requeued job restarts
     from the top of the batch script, with SLURM_RESTART_COUNT set);
  2. on SIGUSR1, or when the request file appears, save a checkpoint at the next step
     boundary (never inside a step), print the request's reason and ack, so slurmgpu can
     drain the node and requeue the job right away instead of waiting for the deadline;
  3. keep training, and saving every 10 steps, until the job is requeued (or finishes):
     when many nodes fail at once the circuit breaker may hold the drain until an admin
     releases it, and the job runs on meanwhile (the request's reason then ends with
     "drain held by the circuit breaker; ..."); what it trains then is not lost.

With PyTorch installed it trains a tiny model with torch and saves with torch.save;
without it, the same loop runs a pure-Python linear regression (handy for testing the
plumbing on a machine without torch).

    sbatch --requeue --gres=gpu:1 --wrap "exec python3 train_with_checkpoint.py --ckpt \\$HOME/ckpt/run1.pt"
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

try:  # the real thing when available
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

checkpoint_requested = False


def on_signal(signum: int, _frame: Any) -> None:
    # Only set a flag: saving inside a signal handler could catch the model mid-update.
    global checkpoint_requested
    checkpoint_requested = True
    print(f"got signal {signal.Signals(signum).name}: checkpoint at the next step", flush=True)


def read_request(path: str | None) -> dict[str, Any]:
    """The request file's content ({} when there is none): the agent writes
    {"state": "requested", "reason": ..., "deadline": ...} when a checkpoint is wanted."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def request_file_says_checkpoint(path: str | None) -> bool:
    return read_request(path).get("state") == "requested"


def ack(note: str) -> None:
    """Tell slurmgpu the checkpoint is safe: `slurmgpu ckpt ack`, or write the file."""
    path = os.environ.get("SLURMGPU_CHECKPOINT_FILE")
    try:
        subprocess.run(["slurmgpu", "ckpt", "ack", "--note", note], check=True, timeout=30,
                       stdout=subprocess.DEVNULL)
        return
    except (OSError, subprocess.SubprocessError):
        pass  # slurmgpu not on PATH in the job: writing the file is the same ack
    if path:  # (keeping what was asked, as `slurmgpu ckpt ack` does: `ckpt status` shows it)
        tmp = f"{path}.tmp"
        acked = {**read_request(path), "state": "acked", "acked_at": time.time(), "note": note}
        Path(tmp).write_text(json.dumps(acked))
        os.replace(tmp, path)


class Model:
    """y = w*x + b trained by SGD; a torch module when torch is there."""

    def __init__(self) -> None:
        if torch is not None:
            self.net = torch.nn.Linear(1, 1)
            self.opt = torch.optim.SGD(self.net.parameters(), lr=0.05)
        else:
            self.w, self.b = 0.0, 0.0

    def step(self, rng: random.Random) -> float:
        xs = [rng.uniform(-1, 1) for _ in range(32)]
        ys = [3.0 * x + 0.5 for x in xs]
        if torch is not None:
            x = torch.tensor(xs).unsqueeze(1)
            y = torch.tensor(ys).unsqueeze(1)
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            return float(loss)
        grad_w = sum(2 * (self.w * x + self.b - y) * x for x, y in zip(xs, ys, strict=True)) / len(xs)
        grad_b = sum(2 * (self.w * x + self.b - y) for x, y in zip(xs, ys, strict=True)) / len(xs)
        self.w -= 0.05 * grad_w
        self.b -= 0.05 * grad_b
        return sum((self.w * x + self.b - y) ** 2 for x, y in zip(xs, ys, strict=True)) / len(xs)

    def state(self) -> Any:
        return self.net.state_dict() if torch is not None else {"w": self.w, "b": self.b}

    def load(self, state: Any) -> None:
        if torch is not None:
            self.net.load_state_dict(state)
        else:
            self.w, self.b = state["w"], state["b"]


def save(path: Path, model: Model, step: int, rng: random.Random) -> None:
    """Write to a temporary file and rename: a crash mid-save never leaves a torn checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    data = {"step": step, "model": model.state(), "rng": rng.getstate()}
    if torch is not None:
        torch.save(data, tmp)
    else:
        tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def load(path: Path, model: Model, rng: random.Random) -> int:
    if not path.exists():
        return 0
    if torch is not None:
        data = torch.load(path, weights_only=False)
    else:
        data = json.loads(path.read_text())
        data["rng"] = (data["rng"][0], tuple(data["rng"][1]), data["rng"][2])
    model.load(data["model"])
    rng.setstate(data["rng"])
    return int(data["step"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True, type=Path, help="checkpoint file (shared storage)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--step-time", type=float, default=0.1, help="seconds per step (simulated work)")
    parser.add_argument("--save-every", type=int, default=0, help="also save every N steps (0: only when asked)")
    args = parser.parse_args()

    signal.signal(signal.SIGUSR1, on_signal)
    request_file = os.environ.get("SLURMGPU_CHECKPOINT_FILE")
    global checkpoint_requested

    model, rng = Model(), random.Random(1234)
    start = load(args.ckpt, model, rng)
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    print(f"job {os.environ.get('SLURM_JOB_ID', '-')} on {os.environ.get('SLURMD_NODENAME', '-')} "
          f"restart {restarts}: " + (f"resumed from step {start}" if start else "starting fresh"),
          flush=True)
    acked_request = False
    for step in range(start + 1, args.steps + 1):
        loss = model.step(rng)
        time.sleep(args.step_time)
        # Poll the request file every 10 steps (cheap: one stat + a tiny read).
        if not acked_request and step % 10 == 0 and request_file_says_checkpoint(request_file):
            checkpoint_requested = True
        if checkpoint_requested:
            save(args.ckpt, model, step, rng)
            reason = read_request(request_file).get("reason") or "(no request file: the signal alone)"
            # Print before the ack: once acked, a drain-now requeue may stop this process
            # at any moment.
            print(f"checkpoint requested: {reason}", flush=True)
            print(f"checkpoint saved at step {step} (loss {loss:.4f}), acking", flush=True)
            ack(f"saved step {step}")
            checkpoint_requested, acked_request = False, True
        elif acked_request and step % (args.save_every or 10) == 0:
            # Acked, still running: the drain may be held (circuit breaker) or the node
            # only stops taking new jobs. Keep saving until the requeue comes.
            save(args.ckpt, model, step, rng)
            print(f"saved step {step} after the ack (until the job is requeued)", flush=True)
        elif args.save_every and step % args.save_every == 0:
            save(args.ckpt, model, step, rng)
    save(args.ckpt, model, args.steps, rng)
    print(f"finished {args.steps} steps, loss {loss:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
