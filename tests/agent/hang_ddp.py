"""An unmodified PyTorch DDP job on gloo for the hang-report acceptance test (hang_report_test.sh):
it reads only the launcher's environment, like any torchrun script. Test-only variables:
  TDIST_TEST_SPIN_RANK   this global rank spins in Python (tdist_test_spin_forever) at step
                         TDIST_TEST_HANG_STEP instead of training (unset: none)
  TDIST_TEST_HANG_STEP   the step (default 3)
  TDIST_TEST_READY_DIR   at that step each rank writes its pid to READY_DIR/rank<R> (the test then
                         knows every rank is in the training loop)
The other ranks go on to the next collective and wait there. Never exits on its own while a rank
hangs; 200000 steps otherwise.
"""
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def tdist_test_spin_forever():
    n = 0
    while True:
        n += 1


def train_step(model, opt, x):
    loss = model(x).sum()
    opt.zero_grad()
    loss.backward()  # DDP all-reduces the gradients here
    opt.step()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    spin = int(os.environ.get("TDIST_TEST_SPIN_RANK", "-1"))
    hang_step = int(os.environ.get("TDIST_TEST_HANG_STEP", "3"))
    ready = os.environ.get("TDIST_TEST_READY_DIR")
    torch.manual_seed(rank)
    model = DDP(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(200000):
        if step == hang_step and ready:
            with open(os.path.join(ready, "rank%d" % rank), "w") as f:
                f.write(str(os.getpid()))
        if step == hang_step and rank == spin:
            tdist_test_spin_forever()
        train_step(model, opt, torch.randn(8, 16))
        time.sleep(0.02)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
