"""Export a LLaMA-architecture model larger than the machine's memory: weights streamed from a safetensors checkpoint.

Not part of CI. Steps (each timed; the export runs in a fresh process whose peak RSS, ``VmHWM``, is reported):

1. write a random bfloat16 checkpoint as transformers writes one (``model-0000k-of-0000n.safetensors`` shards and
   ``model.safetensors.index.json``), tensor by tensor from a reused pool of random values: the model is never
   built in memory;
2. build the model on the ``meta`` device from its ``LlamaConfig`` and ``fx2onnx.export(..., weights=folder)``,
   then ``save``: with ``--save-mode reference`` (the default) into the checkpoint's folder with
   ``weights="reference"`` (external data pointing at the checkpoint's own bytes, nothing copied), with
   ``--save-mode copy`` to ``onnx/model.onnx`` with its weights copied to external data; the export and the save
   are timed apart;
3. ``verify_weights`` on the saved model: ``onnx.checker`` (full_check), external-data references complete and in
   bounds, 64 elements of every weight compared byte for byte with the checkpoint;
4. ``dd`` of the checkpoint's bytes for reference: the first ``--dd-shards`` shards (all: 0) copied to one file on
   the same disk (8 MiB blocks, fsync at the end), so the time to copy the whole checkpoint is measured on a part
   when the disk cannot hold a second copy; and the whole checkpoint read to /dev/null (``iflag=direct``: from
   the disk, not the page cache);
5. delete the exported model, the dd copy and (unless ``--keep``) the checkpoint.

    python benchmarks/llama_meta_weights.py --folder /work/big --ratio 1.5 --dd-shards 3     # weights = 1.5 x MemTotal
    python benchmarks/llama_meta_weights.py --folder /tmp/small --layers 2 --hidden 512 --intermediate 1408

The disk must hold the checkpoint (and, in copy mode, the exported model; and the dd copy), plus `--reserve` GB
(20) left free: the script refuses to start otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

GB = 10**9
GiB = 2**30
SHARD_BYTES = 4 * GB
POOL_ELEMENTS = 64 * 2**20  # 128 MiB of random bfloat16 values, sliced at random offsets for every tensor


def llama_config(args: argparse.Namespace) -> object:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def layers_for_ratio(args: argparse.Namespace) -> int:
    """The number of decoder layers that makes the bfloat16 weights `ratio` x the machine's MemTotal."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    head_dim = args.hidden // args.heads
    per_layer = (
        args.hidden * args.hidden * 2  # q, o
        + args.hidden * args.kv_heads * head_dim * 2  # k, v
        + args.hidden * args.intermediate * 3  # gate, up, down
        + args.hidden * 2  # norms
    ) * 2
    outside = (args.vocab * args.hidden * 2 + args.hidden) * 2
    return math.ceil((args.ratio * memory - outside) / per_layer)


def meta_state(config: object) -> dict[str, tuple[tuple[int, ...], object]]:
    """The model's state_dict names, shapes and dtypes, from a model built on the meta device (no memory)."""
    model = build_meta_model(config)
    return {name: (tuple(t.shape), t.dtype) for name, t in model.state_dict().items()}


def build_meta_model(config: object) -> object:
    """The model in bfloat16 on the meta device (its non-persistent rotary buffers in float32, as from_pretrained
    makes them)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()


def write_checkpoint(folder: Path, config: object) -> tuple[int, float]:
    """Random bfloat16 shards and their index, tensor by tensor; returns (bytes, seconds)."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)  # type: ignore[attr-defined]
    state = meta_state(config)
    shards: list[list[str]] = [[]]
    filled = 0
    for name, (shape, _) in state.items():
        nbytes = math.prod(shape) * 2
        if filled and filled + nbytes > SHARD_BYTES:
            shards.append([])
            filled = 0
        shards[-1].append(name)
        filled += nbytes
    generator = torch.Generator().manual_seed(0)
    pool = (torch.randn(POOL_ELEMENTS, generator=generator) * 0.02).to(torch.bfloat16)
    weight_map, total, start = {}, 0, time.perf_counter()
    for index, names in enumerate(shards):
        file_name = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name in names:
            nbytes = math.prod(state[name][0]) * 2
            header[name] = {"dtype": "BF16", "shape": list(state[name][0]), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = file_name
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)
        with open(folder / file_name, "wb") as file:
            file.write(len(encoded).to_bytes(8, "little") + encoded)
            for name in names:
                elements = math.prod(state[name][0])
                while elements:  # random slices of the pool, so that no two tensors are alike
                    begin = int(torch.randint(0, POOL_ELEMENTS, (1,), generator=generator))
                    count = min(elements, POOL_ELEMENTS - begin)
                    file.write(memoryview(pool[begin : begin + count].view(torch.uint8).numpy()))
                    elements -= count
        total += offset
        print(f"  wrote {file_name}: {offset / GB:.2f} GB", flush=True)
    index_json = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=2))
    return total, time.perf_counter() - start


def export_child(folder: str, output: str, mode: str) -> None:
    """In a fresh process: build the meta model, export with weights=folder, save; print figures as JSON."""
    import torch
    from transformers import AutoConfig

    import fx2onnx

    config = AutoConfig.from_pretrained(folder)
    start = time.perf_counter()
    model = build_meta_model(config)
    built = time.perf_counter() - start
    input_ids = torch.randint(0, config.vocab_size, (1, 16))
    start = time.perf_counter()
    program = fx2onnx.export(model, (input_ids,), kwargs={"use_cache": False}, weights=folder, progress=False)
    exported = time.perf_counter() - start
    rss_after_export = _status_gib("VmRSS")
    start = time.perf_counter()
    if mode == "reference":
        program.save(output, weights="reference")
    else:
        program.save(output, external_data=True)
    saved = time.perf_counter() - start
    figures = {
        "build_seconds": built,
        "export_seconds": exported,
        "save_seconds": saved,
        "rss_after_export_gib": rss_after_export,
        "peak_rss_gib": _status_gib("VmHWM"),
        "weight_bytes": program.weight_bytes,
    }
    print("FIGURES " + json.dumps(figures), flush=True)


def _status_gib(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2**20
    return 0.0


def dd_copy_seconds(shards: list[Path], target: Path) -> float:
    """dd of `shards` into one file on the same disk, 8 MiB blocks, flushed (fsync) at the end."""
    start = time.perf_counter()
    for shard in shards:
        subprocess.run(
            ["dd", f"if={shard}", f"of={target}", "bs=8M", "oflag=append", "conv=notrunc,fsync", "status=none"],
            check=True,
        )
    return time.perf_counter() - start


def dd_read_seconds(shards: list[Path]) -> float:
    """dd of `shards` to /dev/null with direct I/O: the disk's read speed, not the page cache's."""
    start = time.perf_counter()
    for shard in shards:
        subprocess.run(["dd", f"if={shard}", "of=/dev/null", "bs=8M", "iflag=direct", "status=none"], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", required=True, help="where the checkpoint and the exported model go")
    parser.add_argument("--ratio", type=float, default=1.5, help="weights / MemTotal (sets --layers)")
    parser.add_argument("--layers", type=int, help="decoder layers (instead of --ratio)")
    parser.add_argument("--hidden", type=int, default=6144)
    parser.add_argument("--intermediate", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=48)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--reserve", type=float, default=20, help="GB the disk must keep free")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint")
    parser.add_argument("--save-mode", choices=("reference", "copy"), default="reference")
    parser.add_argument("--dd-shards", type=int, default=0, help="dd (copy) only the first N shards (0: all)")
    parser.add_argument("--export-child", nargs=3, metavar=("CHECKPOINT", "OUTPUT", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export_child:
        export_child(*args.export_child)
        return

    if args.layers is None:
        args.layers = layers_for_ratio(args)
    config = llama_config(args)
    state = meta_state(config)
    weight_bytes = sum(math.prod(shape) * 2 for shape, _ in state.values())
    parameters = weight_bytes // 2
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    folder = Path(args.folder).absolute()
    checkpoint, out = folder / "checkpoint", folder / "onnx"
    folder.mkdir(parents=True, exist_ok=True)
    index = checkpoint / "model.safetensors.index.json"
    existing = json.loads(index.read_text())["metadata"]["total_size"] if index.exists() else 0  # a complete one
    on_disk = sum(f.stat().st_size for f in checkpoint.glob("*.safetensors")) if checkpoint.exists() else 0
    free = shutil.disk_usage(folder).free + on_disk  # shards of an incomplete checkpoint are overwritten
    shard_count = math.ceil(weight_bytes / SHARD_BYTES)
    dd_bytes = weight_bytes if not args.dd_shards else min(weight_bytes, args.dd_shards * SHARD_BYTES)
    copies = 1 if args.save_mode == "copy" else 0
    needed = (1 + copies) * weight_bytes + dd_bytes + args.reserve * GB
    print(
        f"model: {args.layers} layers, hidden {args.hidden}, {parameters / 1e9:.1f}B parameters, "
        f"{weight_bytes / GB:.1f} GB in bfloat16 = {weight_bytes / memory:.2f} x MemTotal ({memory / GiB:.1f} GiB), "
        f"about {shard_count} shards; save mode {args.save_mode}; disk free {free / GB:.0f} GB, needed "
        f"{needed / GB:.0f} GB",
        flush=True,
    )
    if free < needed:
        raise SystemExit(f"not enough disk: {free / GB:.0f} GB free, {needed / GB:.0f} GB needed")

    if existing != weight_bytes:
        print("writing the checkpoint...", flush=True)
        written, seconds = write_checkpoint(checkpoint, config)
        print(f"checkpoint: {written / GB:.1f} GB in {seconds:.0f} s ({written / GB / seconds:.2f} GB/s)", flush=True)
    start = time.perf_counter()
    os.sync()  # the checkpoint's writes reach the disk now, not during the save's fsyncs
    print(f"sync: {time.perf_counter() - start:.0f} s", flush=True)
    out.mkdir(exist_ok=True)
    model_path = checkpoint / "model.onnx" if args.save_mode == "reference" else out / "model.onnx"
    try:
        print("exporting (fresh process)...", flush=True)
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--folder",
                str(folder),
                "--export-child",
                str(checkpoint),
                str(model_path),
                args.save_mode,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        figures = json.loads(next(line for line in child.stdout.splitlines() if line.startswith("FIGURES "))[8:])
        print(json.dumps(figures, indent=1), flush=True)
        sys.path.insert(0, str(Path(__file__).parent.parent / "src"))
        from fx2onnx._weights import verify_weights

        start = time.perf_counter()
        check = verify_weights(model_path, checkpoint, samples=64)
        print(f"{check}\n  ({time.perf_counter() - start:.0f} s)", flush=True)
        written_files = [model_path, *(p for p in model_path.parent.iterdir() if p.name.startswith("model.onnx."))]
        data_bytes = sum(f.stat().st_size for f in written_files)
        print(f"files written by the save: {data_bytes / GB:.3f} GB ({', '.join(p.name for p in written_files)})")
        for path in written_files:
            path.unlink()
        shutil.rmtree(out)
        out.mkdir()
        shards = sorted(checkpoint.glob("*.safetensors"))
        copied = shards[: args.dd_shards] if args.dd_shards else shards
        copied_bytes = sum(p.stat().st_size for p in copied)
        dd_copy = dd_copy_seconds(copied, out / "dd.bin")
        (out / "dd.bin").unlink()
        all_bytes = sum(p.stat().st_size for p in shards)
        dd_read = dd_read_seconds(shards)
        full_copy = dd_copy * all_bytes / copied_bytes
        save = figures["save_seconds"]
        print(
            f"dd copy of {len(copied)}/{len(shards)} shards ({copied_bytes / GB:.1f} GB): {dd_copy:.0f} s "
            f"({copied_bytes / GB / dd_copy:.2f} GB/s) -> the whole checkpoint ({all_bytes / GB:.1f} GB) at that rate "
            f"{full_copy:.0f} s; dd read of the whole checkpoint to /dev/null (direct): {dd_read:.0f} s "
            f"({all_bytes / GB / dd_read:.2f} GB/s)\n"
            f"save ({args.save_mode}) {save:.1f} s = {save / full_copy:.3f} x dd copy; export (capture..legalize) "
            f"{figures['export_seconds']:.0f} s; peak RSS {figures['peak_rss_gib']:.2f} GiB",
            flush=True,
        )
    finally:
        shutil.rmtree(out, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(checkpoint, ignore_errors=True)
        elif args.save_mode == "reference":
            for path in checkpoint.glob("model.onnx*"):
                path.unlink()


if __name__ == "__main__":
    main()
