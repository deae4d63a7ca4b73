"""The Hugging Face stack picks neuron by itself (client/api/neuronx.py): transformers.Trainer
with nothing set trains on neuron:0, with the CPU's losses; accelerate launch runs two
processes over the neuron process group."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch


def _train(tmp_path, use_cpu: bool) -> tuple[list[float], str]:
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (8, 16), generator=g)]
    args = TrainingArguments(
        output_dir=str(tmp_path / ("cpu" if use_cpu else "neuron")),
        max_steps=3,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=use_cpu,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, str(next(model.parameters()).device)


def test_a_trainer_with_nothing_set_trains_on_neuron_as_on_the_cpu(tmp_path):
    assert importlib.util.find_spec("torch_neuronx") is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu_losses, cpu_device = _train(tmp_path, use_cpu=True)
        losses, device = _train(tmp_path, use_cpu=False)
    assert cpu_device == "cpu" and device == "neuron:0"
    assert len(losses) == 3 and losses == pytest.approx(cpu_losses, rel=1e-5)


def test_the_stand_in_never_shadows_a_real_torch_neuronx(tmp_path):
    real = tmp_path / "torch_neuronx"
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    code = "import torch, torch_neuronx; print(getattr(torch_neuronx, 'REAL', False))"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert out.stdout.strip() == "True", out.stderr


@pytest.mark.slow
def test_accelerate_launch_runs_two_processes_over_the_neuron_group(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            import torch
            from accelerate import Accelerator
            acc = Accelerator()
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
            reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
            reference.load_state_dict(model.state_dict())
            opt = torch.optim.SGD(model.parameters(), lr=0.1)  # before prepare, as people do
            ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
            model, opt = acc.prepare(model, opt)
            g = torch.Generator().manual_seed(1)
            for step in range(3):
                x = torch.randn(2 * acc.num_processes, 8, generator=g)
                mine = x[2 * acc.process_index : 2 * acc.process_index + 2]
                loss = model(mine.to(acc.device)).pow(2).mean()
                opt.zero_grad(); acc.backward(loss); opt.step()
                ref = reference(x).pow(2).mean()  # the whole batch on the CPU: DDP's average
                ref_opt.zero_grad(); ref.backward(); ref_opt.step()
            worst = max((a.detach().cpu() - b.detach()).abs().max().item()
                        for a, b in zip(acc.unwrap_model(model).parameters(), reference.parameters()))
            line = (f"rank {acc.process_index} {acc.device} {acc.distributed_type} "
                    f"{torch.distributed.get_backend()} {worst:.1e}")
            # (a file per rank: two processes printing at once may share a line of stdout)
            with open(os.path.join(os.environ["RANKS_OUT"], f"rank-{acc.process_index}"), "w") as f:
                f.write(line)
            """
        )
    )
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--main_process_port",
            str(port),
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "HF_HOME": str(tmp_path), "RANKS_OUT": str(tmp_path)},
    )
    lines = [p.read_text() for p in sorted(tmp_path.glob("rank-*"))]
    assert len(lines) == 2, out.stdout + out.stderr
    for rank, line in enumerate(lines):
        _, r, device, kind, backend, worst = line.split()
        assert (r, device, kind, backend) == (
            str(rank),
            "neuron:0",
            "DistributedType.MULTI_NEURON",
            "neuron",
        )
        assert float(worst) < 1e-6
