"""Step time and tokens/s of model variants on the same shape and batch, alternating in one process.

    python benchmarks/throughput.py [--preset small] [--variants linear,nonlinear,linear:unfused]
                                    [--nanogpt PATH/TO/nanoGPT/model.py] [--rounds 15] [--steps 2]
                                    [--batch-size 8|auto] [--vocab-size 8192] [--dtype float32|bfloat16]
                                    [--compile] [--device cpu|cuda] [--json FILE]

A variant is a query projection name, optionally with options after colons: `unfused` computes q and
k/v with separate matmuls (nlq 0.1), `mlp4.75` sets model.mlp_ratio=4.75, `gate` (or `gate-headwise`) adds the
attention output gate (model.attn_gate), `qknorm` sets model.qk_norm, `diff` differential attention
(model.attention=differential), `outnorm` its norm alone (model.attn_out_norm), `bf16` runs that variant under
bfloat16 autocast (whatever --dtype says), so fp32 and bf16 alternate in one process. `--nanogpt PATH` adds
karpathy/nanoGPT's GPT (loaded from that file, never copied into this repository) at the same shape
(no biases, dropout 0, tied embeddings) with its own optimizer setup (`configure_optimizers`: on CPU, the
default non-fused AdamW).

On CUDA, `--batch-size auto` takes the largest power-of-two micro-batch (up to 64) whose step fits in
memory for every variant; the report adds MFU (6N + 12LdT FLOPs per token against the GPU's bf16 peak,
or --peak-tflops) and each variant's peak memory.

Each round runs `--steps` full training steps (forward, backward, clip 1.0, AdamW) of every variant in
turn, so machine noise hits all variants alike. Reported: the median step time over rounds, and the
median over rounds of each variant's step-time ratio to the first variant (paired within a round; the
steadier of the two numbers on a noisy machine). Random tokens: a step's cost does not depend on the data.
"""

import argparse
import importlib.util
import json
import resource
import statistics
import time
from pathlib import Path

import torch

from nlq.config import TrainConfig
from nlq.model import Attention, Transformer
from nlq.presets import get_preset, with_model
from nlq.training.hardware import peak_flops, tune_allocator
from nlq.training.trainer import make_optimizer


def make_step(model, optimizer, x, y, dtype):
    def step():
        with torch.autocast(x.device.type, dtype=dtype, enabled=dtype is not None):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def nlq_variant(spec: str, base, changes: dict, device: torch.device):
    query, *options = spec.split(":")
    model_changes = dict(changes, query=query)
    for option in options:
        if option.startswith("mlp"):
            model_changes["mlp_ratio"] = float(option[3:])
        elif option in ("gate", "gate-headwise"):
            model_changes["attn_gate"] = "elementwise" if option == "gate" else "headwise"
        elif option == "qknorm":
            model_changes["qk_norm"] = True
        elif option == "diff":
            model_changes["attention"] = "differential"
        elif option == "outnorm":
            model_changes["attn_out_norm"] = True
        elif option not in ("unfused", "bf16"):
            raise SystemExit(f"unknown variant option {option!r} in {spec!r}; options: unfused, mlpR, gate, "
                             "gate-headwise, qknorm, diff, outnorm, bf16")
    cfg = with_model(base, **model_changes).model
    model = Transformer(cfg, seed=0).to(device)
    for module in model.modules():
        if isinstance(module, Attention):
            module.fused_input = "unfused" not in options
    optimizer = make_optimizer(model, base.train, device, sharded=False)
    about = f"{model.num_parameters():,} non-embedding parameters, {model.flops_per_token():,} FLOPs/token"
    return cfg, model, optimizer, about


def nanogpt_variant(path: str, cfg, train, device: torch.device):
    spec = importlib.util.spec_from_file_location("nanogpt_model", Path(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gpt_config = module.GPTConfig(block_size=cfg.block_size, vocab_size=cfg.vocab_size, n_layer=cfg.n_layer,
                                  n_head=cfg.n_head, n_embd=cfg.n_embd, dropout=0.0, bias=False)
    model = module.GPT(gpt_config).to(device)
    optimizer = model.configure_optimizers(train.weight_decay, train.lr, (train.beta1, train.beta2), device.type)
    return model, optimizer, f"{model.get_num_params():,} parameters (nanoGPT's count), its own AdamW setup"


def build(spec, args, base, changes, device, batch_size, compile_model=None):
    torch.manual_seed(0)
    cfg = with_model(base, **changes).model
    if spec == "nanogpt":
        model, optimizer, about = nanogpt_variant(args.nanogpt, cfg, base.train, device)
        flops = None
    else:
        cfg, model, optimizer, about = nlq_variant(spec, base, changes, device)
        flops = model.flops_per_token()
    x = torch.randint(0, cfg.vocab_size, (batch_size, cfg.block_size), device=device)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" or spec.endswith(":bf16") or ":bf16:" in spec else None
    compile_model = args.compile if compile_model is None else compile_model
    return cfg, make_step(torch.compile(model) if compile_model else model, optimizer, x, x, dtype), about, flops


def largest_batch(specs, args, base, changes, device) -> int:
    """The largest power-of-two micro-batch (<= 64) whose training step fits for every variant (searched in
    eager mode: compiling every candidate would take minutes, and compiled steps need no more memory)."""
    for batch_size in (64, 32, 16, 8, 4, 2, 1):
        try:
            for spec in specs:
                _, step, _, _ = build(spec, args, base, changes, device, batch_size, compile_model=False)
                step()
                del step
                torch.cuda.empty_cache()
            return batch_size
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
    raise SystemExit("not even a micro-batch of 1 fits")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--variants", default="linear,nonlinear")
    parser.add_argument("--nanogpt", help="path to karpathy/nanoGPT's model.py: adds a 'nanogpt' variant")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch-size", default="8", help="rows per step, or auto (CUDA: the largest that fits)")
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--peak-tflops", type=float, default=None, help="for MFU; default: known GPUs in bf16")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--no-allocator-tuning", action="store_true", help="leave glibc malloc at its defaults")
    args = parser.parse_args()
    if args.nanogpt and not Path(args.nanogpt).is_file():
        raise SystemExit(f"--nanogpt {args.nanogpt}: no such file; give the path to nanoGPT's model.py")

    if not args.no_allocator_tuning:
        tune_allocator()
    device = torch.device(args.device)
    base = get_preset(args.preset)
    changes = {k: v for k, v in (("block_size", args.block_size), ("vocab_size", args.vocab_size)) if v}
    specs = args.variants.split(",") + (["nanogpt"] if args.nanogpt else [])
    if args.batch_size == "auto":
        batch_size = largest_batch(specs, args, base, changes, device) if device.type == "cuda" else 8
    else:
        batch_size = int(args.batch_size)
    steps, flops, memory = {}, {}, {}
    for spec in specs:
        if device.type == "cuda":
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        cfg, step, about, flops[spec] = build(spec, args, base, changes, device, batch_size)
        step()  # warm up (and compile)
        if device.type == "cuda":
            torch.cuda.synchronize()
            memory[spec] = (torch.cuda.max_memory_allocated() - before) / 2**30
        steps[spec] = step
        print(f"{spec:>16}: {about}")
    tokens = batch_size * cfg.block_size
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    peak = peak_flops(TrainConfig(peak_tflops=args.peak_tflops), device, dtype)
    print(f"preset {args.preset} {changes or ''}, batch {batch_size} x {cfg.block_size}, {args.dtype}"
          f"{' compiled' if args.compile else ''}, {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda"
             else f", {torch.get_num_threads()} threads")
          + f", {args.rounds} rounds x {args.steps} steps, allocator "
            f"{'default' if args.no_allocator_tuning else 'tuned'}")
    times = {name: [] for name in steps}
    faults_before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(args.rounds):
        for name, step in steps.items():
            _sync(device)
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            _sync(device)
            times[name].append((time.perf_counter() - start) / args.steps)
    faults_after = resource.getrusage(resource.RUSAGE_SELF)
    n_steps = args.rounds * args.steps * len(steps)
    print(f"minor page faults per step: {(faults_after.ru_minflt - faults_before.ru_minflt) / n_steps:,.1f}, "
          f"system time per step: {(faults_after.ru_stime - faults_before.ru_stime) / n_steps * 1000:.1f} ms "
          "(all variants together)")
    first, results = specs[0], {}
    for name, values in times.items():
        median = statistics.median(values)
        paired = statistics.median(v / f for v, f in zip(values, times[first]))
        results[name] = {"ms_per_step": median * 1000, "tokens_per_s": tokens / median, "ratio_to_first": paired,
                         "mfu": flops[name] * tokens / median / peak if peak and flops[name] else None,
                         "peak_memory_gib": memory.get(name)}
        line = (f"{name:>16}: {median * 1000:8.1f} ms/step  {tokens / median:9,.0f} tokens/s  "
                f"step time x{paired:.3f} vs {first}")
        if results[name]["mfu"] is not None:
            line += f"  MFU {results[name]['mfu']:.1%}"
        if name in memory:
            line += f"  peak memory {memory[name]:.1f} GiB"
        print(line + " (median of per-round ratios)")
    if args.json:
        Path(args.json).write_text(json.dumps({"preset": args.preset, "batch_size": batch_size,
                                               "context": cfg.block_size,
                                               "dtype": args.dtype, "compile": args.compile, "device": str(device),
                                               "variants": results}, indent=2) + "\n")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
