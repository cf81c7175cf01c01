"""The in-process probe in real processes: a plain loop's steps, losses, saves and resume; a user's
own sitecustomize; a hook's error; `health.probe: off`."""

from __future__ import annotations

import itertools
import json
import math

from aerie_contracts import probe as contract
from agent import inproc

from .conftest import TRAIN


def test_a_plain_loop_reports_its_steps_and_losses(run):
    proc = run.python([str(run.script(TRAIN))])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and "aerie probe" not in proc.stderr
    steps = run.steps()
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(r["loss"]) and r["loss"] == r["local_loss"] for r in steps)
    assert steps[-1]["loss"] < steps[0]["loss"]  # it trains
    assert steps[0]["step_s"] is None  # the first step's time is the script's setup too
    assert all(r["step_s"] >= r["backward_s"] >= 0 and r["rank"] == 0 for r in steps[1:])
    state = json.loads((run.ranks / contract.STATE_FILE.format(rank=0)).read_text())
    assert state[contract.STATE_STEP] == 5 and state[contract.STATE_COLLECTIVES] == 0
    assert (run.ranks / contract.STACKS_FILE.format(rank=0)).exists()
    # Its exit is a wind-down: `train_end` after the last step (the agent's own limit for it).
    last = run.records()[-1]
    assert last["event"] == "train_end" and last["step"] == 5 and last["source"] == "probe", run.records()[-2:]


def test_a_loop_faster_than_record_s_folds_its_steps_into_fewer_records(run):
    """The default `RECORD_S` (no `AERIE_PROBE_RECORD_S`): 400 sub-millisecond steps give far fewer
    records, the first step's at once and the last one's before `train_end` (so the agent's last
    step is the rank's); each record says how many steps it stands for, and they add up."""
    env = run.env(STEPS="400")
    del env["AERIE_PROBE_RECORD_S"]
    proc = run.python([str(run.script(TRAIN))], env=env)
    assert proc.returncode == 0, proc.stderr
    steps = run.steps()
    assert steps[0]["step"] == 1 and steps[0][contract.FOLDED] == 1
    assert steps[-1]["step"] == 400 and any(r[contract.FOLDED] > 1 for r in steps), [r["step"] for r in steps]
    assert sum(r[contract.FOLDED] for r in steps) == 400
    # The rate: a record that stands for more than one step comes RECORD_S after the one before it
    # (`t` is rounded to the millisecond), however fast or slow the host ran the loop; all but the
    # last, flushed at exit with the steps since.
    for before, rec in itertools.pairwise(steps[:-1]):
        if rec[contract.FOLDED] > 1:
            assert rec["t"] - before["t"] >= contract.RECORD_S - 0.002, (before, rec)
    assert [r["step"] for r in steps] == sorted({r["step"] for r in steps})  # increasing, none twice
    assert all(math.isfinite(r["loss"]) for r in steps)  # a folded record still has its newest step's loss
    assert all(r["step_s"] >= r["backward_s"] >= 0 for r in steps[1:])  # the longest step, the mean phases
    assert run.records()[-1]["event"] == "train_end" and run.records()[-1]["step"] == 400


def test_a_script_that_fails_ends_with_no_train_end(run):
    proc = run.python([str(run.script(TRAIN + "\nraise RuntimeError('the loop failed')\n"))])
    assert proc.returncode == 1 and "the loop failed" in proc.stderr
    assert [r["step"] for r in run.steps()] == [1, 2, 3, 4, 5]
    assert all(r["event"] != "train_end" for r in run.records()), run.records()[-2:]


def test_a_resumed_loop_continues_its_numbering_and_its_save_is_a_section(run):
    script = str(run.script(TRAIN))
    env = run.env(CKPT=str(run.tmp / "ckpt.pt"), STEPS="3")
    assert run.python([script], env).returncode == 0
    proc = run.python([script], env)
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in run.steps()] == [1, 2, 3, 4, 5, 6]  # Adam's restored step count
    events = [r for r in run.records() if r["event"] not in (None, "train_end")]
    assert [r["event"] for r in events] == ["checkpoint_begin", "checkpoint_end"] * 2
    assert all(r["ok"] and r["uri"].endswith("ckpt.pt") and r["save_s"] >= 0 for r in events[1::2])
    assert all(r["source"] == "probe" for r in events)


# A loop resumed as torchtitan and Aerie's own trainer resume: DCP's `set_state_dict` primes the new
# optimizer's empty state with one zero-gradient `step()` before it loads the checkpoint into it.
DCP_TRAIN = """
import os, torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
ckpt = os.environ["CKPT"]
if os.path.exists(ckpt):
    saved = torch.load(ckpt)
    set_state_dict(model, opt, model_state_dict=saved["model"], optim_state_dict=saved["opt"])
x = torch.randn(64, 8)
for _ in range(3):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
model_sd, opt_sd = get_state_dict(model, opt)
torch.save({"model": model_sd, "opt": opt_sd}, ckpt)
"""


def test_dcps_state_priming_step_is_not_a_training_step(run):
    script = str(run.script(DCP_TRAIN))
    env = run.env(CKPT=str(run.tmp / "ckpt.pt"))
    for _ in range(2):
        proc = run.python([script], env)
        assert proc.returncode == 0, proc.stderr
        assert "aerie probe" not in proc.stderr
    assert [r["step"] for r in run.steps()] == [1, 2, 3, 4, 5, 6]  # not 1, 2, 3, 1, 4, 5, 6


def test_a_users_own_sitecustomize_still_runs(run):
    own = run.tmp / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nopen(os.environ['MARK'], 'w').write('ran')\nUSER_NAME = 1\n")
    mark = run.tmp / "mark"
    env = run.env(PYTHONPATH=str(own), MARK=str(mark))
    check = "import sys, sitecustomize; assert sitecustomize.USER_NAME == 1; print('torch' in sys.modules)"
    proc = run.python(["-c", check], env)
    assert proc.returncode == 0, proc.stderr
    assert mark.read_text() == "ran" and proc.stdout.strip() == "False"  # dormant: torch never imported
    mark.unlink()
    proc = run.python([str(run.script(TRAIN))], env)
    assert proc.returncode == 0, proc.stderr
    assert mark.read_text() == "ran" and len(run.steps()) == 5


BROKEN = """
import torch
class Odd(torch.optim.SGD):  # keeps a step count the probe cannot read
    def step(self, closure=None):
        out = super().step(closure)
        for p in self.param_groups[0]["params"]:
            self.state[p]["step"] = "not a number"
        return out
model = torch.nn.Linear(4, 1)
opt = Odd(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.save(model.state_dict(), "w.pt")
print("done")
"""


def test_a_hook_error_turns_the_probe_off_not_the_trainer(run):
    proc = run.python([str(run.script(BROKEN))])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done" and (run.tmp / "w.pt").exists()
    assert proc.stderr.count("aerie probe: off") == 1, proc.stderr
    assert run.steps() == [] and not any(r["event"] for r in run.records())  # nothing after the error


def test_health_probe_off_injects_nothing(run):
    site = str(inproc.SITE_DIR)
    assert inproc.child_env({"PYTHONPATH": "/x"})["PYTHONPATH"] == f"{site}:/x"  # on unless turned off
    assert inproc.child_env({"AERIE_PROBE": "on", "PYTHONPATH": "/x"})["PYTHONPATH"] == f"{site}:/x"
    from_spec_on = inproc.child_env({"AERIE_HEALTH": json.dumps({"probe": "on"})})
    assert from_spec_on["PYTHONPATH"] == site and from_spec_on["AERIE_PROBE"] == "on"
    off = inproc.child_env({"AERIE_PROBE": "off", "PYTHONPATH": f"{site}:/x"})
    assert off["PYTHONPATH"] == "/x" and off["AERIE_PROBE"] == "off"
    from_spec = inproc.child_env({"AERIE_HEALTH": json.dumps({"probe": "off"})})
    assert "PYTHONPATH" not in from_spec and from_spec["AERIE_PROBE"] == "off"
    proc = run.python([str(run.script(TRAIN))], inproc.child_env(run.env(AERIE_PROBE="off")), inject=False)
    assert proc.returncode == 0, proc.stderr
    assert run.records() == [] and not run.ranks.exists()


def test_health_probe_is_a_setting_on_by_default():
    from aerie_contracts.health import HealthSettings

    assert HealthSettings().probe == "on"
    assert HealthSettings.from_dict({"probe": "off"}).probe == "off"


# A loop with an evaluation as users write one: forward passes under no_grad, no backward, for
# longer than the probe's eval threshold (`runtime.EVAL_AFTER_S`), then training again.
EVAL_TRAIN = """
import time, torch
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
x = torch.randn(64, 8)
def train(n):
    for _ in range(n):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
train(3)
with torch.no_grad():
    end = time.time() + 3.5
    while time.time() < end:
        model(x)
        time.sleep(0.01)
train(2)
"""


def test_forward_passes_without_backward_are_an_evaluation(run):
    proc = run.python([str(run.script(EVAL_TRAIN))])
    assert proc.returncode == 0, proc.stderr
    records = run.records()
    events = [(r["event"], r["step"]) for r in records if r["event"] not in (None, "train_end")]
    assert [e for e, _ in events] == ["eval_begin", "eval_end"], events
    assert [r["step"] for r in run.steps()] == [1, 2, 3, 4, 5]
    begin = next(r for r in records if r["event"] == "eval_begin")
    third = next(r for r in run.steps() if r["step"] == 3)
    assert begin["t"] >= third["t"] - 0.5  # it began at the evaluation's first forward, after step 3


# Past the probe's discovery steps (`hooks.DISCOVER_STEPS`: the global forward hook is no longer
# armed at every step), an evaluation by the trained model, then one by a model never called in
# training (an EMA copy, a reward model): the first is seen through the model's own hook, the
# second because the probe's thread arms the global hook once the loop has gone quiet.
LATE_EVAL_TRAIN = EVAL_TRAIN.replace("train(3)", "train(40)").replace(
    "train(2)\n",
    """train(2)
other = torch.nn.Linear(8, 1)
with torch.no_grad():
    end = time.time() + 6.0
    while time.time() < end:
        other(x)
        time.sleep(0.01)
train(2)
""",
)


def test_an_evaluation_after_the_discovery_steps_and_one_by_an_unseen_model_are_evaluations(run):
    proc = run.python([str(run.script(LATE_EVAL_TRAIN))])
    assert proc.returncode == 0, proc.stderr
    events = [(r["event"], r["step"]) for r in run.records() if r["event"] not in (None, "train_end")]
    story = [(r["event"] or r["step"], round(r["t"] % 1000, 2)) for r in run.records()[38:]]
    assert [e for e, _ in events] == ["eval_begin", "eval_end"] * 2, story
    assert [r["step"] for r in run.steps()] == list(range(1, 45))


# HF Trainer's pattern under torchrun: training calls the DDP-wrapped model, its evaluation the
# unwrapped one (`self.model`), a module inside the known model. Past the discovery steps, that
# evaluation must still be seen (found 2026-12-04: a rule "a known model's module is never a
# forward of its own" missed every such evaluation and the 60-s evaluation was called a hang).
WRAPPED_EVAL_TRAIN = (
    EVAL_TRAIN.replace(
        "model = torch.nn.Sequential(",
        """class Wrapper(torch.nn.Module):  # stands for DistributedDataParallel(model)
    def __init__(self, module):
        super().__init__()
        self.module = module
    def forward(self, x):
        return self.module(x)
inner = torch.nn.Sequential(""",
    )
    .replace("torch.nn.Linear(16, 1))\n", "torch.nn.Linear(16, 1))\nmodel = Wrapper(inner)\n", 1)
    .replace("train(3)", "train(40)")
    .replace("time.time() + 3.5", "time.time() + 6.0")
    .replace("        model(x)\n", "        inner(x)\n")
)
assert "model = Wrapper(inner)" in WRAPPED_EVAL_TRAIN and "        inner(x)" in WRAPPED_EVAL_TRAIN


def test_an_evaluation_by_the_unwrapped_model_inside_the_trained_wrapper_is_an_evaluation(run):
    proc = run.python([str(run.script(WRAPPED_EVAL_TRAIN))])
    assert proc.returncode == 0, proc.stderr
    events = [r["event"] for r in run.records() if r["event"] not in (None, "train_end")]
    assert events == ["eval_begin", "eval_end"], events
    assert [r["step"] for r in run.steps()] == list(range(1, 43))


SAFETENSORS_TRAIN = """
import os, torch
from safetensors.torch import save_file
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
for _ in range(2):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(os.getcwd(), "model.safetensors"))
"""


def test_a_safetensors_save_is_a_checkpoint_section(run):
    """How HF's `save_pretrained` writes a model (`safetensors.torch.save_file`): a section, like
    `torch.save`, so a long model save is never read as a hang."""
    proc = run.python([str(run.script(SAFETENSORS_TRAIN))])
    assert proc.returncode == 0, proc.stderr
    events = [r for r in run.records() if r["event"] not in (None, "train_end")]
    assert [r["event"] for r in events] == ["checkpoint_begin", "checkpoint_end"], events
    assert events[1]["ok"] and events[1]["uri"].endswith("model.safetensors")
    assert (run.tmp / "model.safetensors").stat().st_size > 0


def test_an_optimizer_without_a_step_count_numbers_on_from_the_resumed_checkpoint(run):
    """SGD keeps no step count: a resumed attempt numbers its steps on from the step of the
    checkpoint Aerie restored for it (`AERIE_RESUME_FROM`), not from 1 (its curve would go back)."""
    sgd = TRAIN.replace("torch.optim.AdamW(", "torch.optim.SGD(")
    assert sgd != TRAIN
    script = str(run.script(sgd))
    resumed = run.env(AERIE_RESUME_FROM="s3://aerie/ckpt/job-1/step_00000050/attempt_0001")
    assert run.python([script], resumed).returncode == 0
    assert [r["step"] for r in run.steps()] == [51, 52, 53, 54, 55]


# Two hangs that must not pass for an evaluation (an eval section suspends the hang detection):
# a rank blocked inside backward() (as in DDP's gradient all-reduce) and one blocked inside its
# first forward (as in FSDP's all-gather), each longer than the eval threshold.
BLOCKED_TRAIN = """
import time, torch

class Blocks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(4.0)
        return grad

class SlowOnce(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.slow = torch.nn.Linear(8, 1), False
    def forward(self, x):
        if self.slow:
            self.slow = False
            time.sleep(4.0)
        return self.inner(x)

model = SlowOnce()
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
x = torch.randn(16, 8)
def step(block=False):
    out = model(x)
    if block:
        out = Blocks.apply(out)
    loss = out.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
for _ in range(3):
    step()
step(block=True)
model.slow = True
step()
"""


def test_a_rank_blocked_in_backward_or_in_one_forward_is_no_evaluation(run):
    proc = run.python([str(run.script(BLOCKED_TRAIN))])
    assert proc.returncode == 0, proc.stderr
    assert [r["event"] for r in run.records() if r["event"] not in (None, "train_end")] == []
    assert [r["step"] for r in run.steps()] == [1, 2, 3, 4, 5]


UNINSTALL = """
import sys, torch
import torch.optim.optimizer as optim
import torch.utils.data.dataloader as loader
hooks = sys.modules["_aerie_inproc.hooks"]  # the probe the site installed at `import torch`
originals = {"backward": torch.autograd.backward.__wrapped__, "save": torch.save.__wrapped__}
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def steps(n):
    for _ in range(n):
        opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
steps(3)
hooks.uninstall()
assert torch.autograd.backward is originals["backward"] and torch.save is originals["save"]
assert not optim._global_optimizer_pre_hooks and not optim._global_optimizer_post_hooks
assert not torch.nn.modules.module._global_forward_pre_hooks and not model._forward_pre_hooks
assert not hasattr(loader._BaseDataLoaderIter.__next__, "__wrapped__")
steps(3)  # not seen
hooks.install(torch, sys.modules["sitecustomize"].when_imported)
steps(2)
kept = hooks.uninstall(keep=True)  # bench/probe.py's switch: the same probe back, its count on
assert not optim._global_optimizer_post_hooks and not model._forward_pre_hooks
steps(1)
hooks.install(torch, sys.modules["sitecustomize"].when_imported, resume=kept)
assert len(model._forward_pre_hooks) == 1  # the known model watched again
steps(2)
"""


def test_uninstall_restores_everything_and_a_new_install_reports_again(run):
    """`hooks.uninstall` (bench/probe.py's in-process comparison): every hook and wrapper gone, so
    the steps in between cost the trainer nothing and are not seen; `install` again reports on."""
    proc = run.python([str(run.script(UNINSTALL))])
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in run.steps()] == [1, 2, 3, 1, 2, 3, 4]  # a new probe counts from 1; a kept one on
    assert [r["event"] for r in run.records() if r["event"]] == ["train_end"]  # the new probe's, at exit
