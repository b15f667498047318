"""Output locations, checked before any work: nothing a user made is replaced without --force.

Every command that writes (train, align, merge, canonicalize, barrier --plot, demo) calls
:func:`check_output` before it loads or computes anything, so that an existing result, a
read-only or full disk, or a path under a file is one clear error up front rather than a
traceback after the work. :func:`output_errors` turns what can still fail while writing (a
disk that filled up meanwhile) into the same kind of one-line error.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from glmc.errors import GlmcError

#: Bytes per stored parameter (float32) and the allowance for configs, reports and headers.
BYTES_PER_PARAM = 4
FOLDER_OVERHEAD = 1.1
#: What a report, a plot or a small JSON file may take.
SMALL_OUTPUT = 1 << 20


def model_bytes(n_params: int) -> int:
    """Estimated size of a model folder of ``n_params`` float32 parameters."""
    return int(n_params * BYTES_PER_PARAM * FOLDER_OVERHEAD)


def check_output(path: str | Path, need_bytes: int = 0, *, force: bool = False,
                 option: str = "-o", into: bool = False, force_flag: str = "--force",
                 inputs: Sequence[str | Path] = ()) -> Path:
    """Refuse, before any work, an output location that cannot take the output.

    Args:
        path: the output file or folder.
        need_bytes: the estimated size of the output (checked against the free space).
        force: an existing non-empty ``path`` may be replaced (or, with ``into``, written
            into); without it that is an error naming ``option``.
        option, force_flag: what names ``path`` and what allows the replacement (command-line
            options, or Python arguments), for the message.
        into: the output is written inside the folder ``path`` (a report folder, a cache);
            otherwise it replaces ``path`` atomically, from beside it.
        inputs: the files and folders the command reads; replacing ``path`` must delete
            none of them, nor anything inside an input folder (``--force`` included).

    Returns:
        ``path`` made absolute.

    Raises:
        GlmcError: ``path`` is empty; ``path`` is or holds an input; ``path`` holds something
            and ``force`` is off; a file stands where a folder is needed; the location is not
            writable; or the disk lacks the space.
    """
    if not str(path).strip():  # (Path("") is the current folder: no output names it so)
        raise GlmcError(f"{option}: empty path")
    p = Path(path).expanduser().absolute()
    out = p.resolve()
    for name in inputs:
        source = Path(name).expanduser().resolve()
        if source == out or out in source.parents:
            raise GlmcError(f"{path}: the output folder would replace input {name}")
        if source.is_dir() and source in out.parents and out.exists():
            raise GlmcError(f"{path}: the output would replace part of input {name}")
    if not force and _occupied(p):
        raise GlmcError(f"{path}: exists and is not empty; pass {force_flag} to replace it, "
                        f"or choose another {option}")
    if into and p.exists() and not p.is_dir():
        raise GlmcError(f"{path}: is a file, not a folder (choose another {option})")
    where = p if into and p.is_dir() else _existing_folder(p.parent, path)
    _probe_writable(where, path)
    check_free_space(where, need_bytes, path)
    return p


#: The figure formats a plot file's suffix may name.
PLOT_FORMATS = ("png", "pdf", "svg")


def check_plot_path(path: str | Path) -> str:
    """The figure format implied by ``path``'s suffix (png, pdf or svg); GlmcError otherwise
    (torch- and matplotlib-free: the command line checks it before loading either)."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise GlmcError(f"{path}: the plot file must end in .png (or .pdf, .svg)")
    return suffix


def check_free_space(where: str | Path, need_bytes: int, path: str | Path | None = None) -> None:
    """Raise GlmcError unless the file system of ``where`` has ``need_bytes`` free."""
    if need_bytes <= 0:
        return
    folder = _existing_folder(Path(where).expanduser().absolute(), path or where)
    free = shutil.disk_usage(folder).free
    if free < need_bytes:
        raise GlmcError(f"{path or where}: the output needs about {_size(need_bytes)}, but "
                        f"{folder} has {_size(free)} free")


@contextlib.contextmanager
def output_errors(path: str | Path) -> Iterator[None]:
    """Turn an OSError while writing ``path`` (disk full, permission) into one GlmcError."""
    try:
        yield
    except OSError as e:
        raise GlmcError(f"{path}: cannot write the output ({e.strerror or e})") from None


def stored_params(folder: str | Path) -> int:
    """Parameters stored in a model folder, from the safetensors headers alone (no loading).

    0 when the folder cannot be read this way (loading it reports the real problem).
    """
    folder = Path(folder)
    if not (folder / "model.safetensors").is_file() and (folder / "pytorch_model.bin").is_file() \
            and not (folder / "model.safetensors.index.json").is_file():
        return (folder / "pytorch_model.bin").stat().st_size // BYTES_PER_PARAM
    shapes = stored_shapes(folder)
    return sum(math.prod(shape) for shape in shapes.values()) if shapes else 0


def stored_shapes(folder: str | Path) -> dict[str, list[int]] | None:
    """Every tensor's shape in a model folder's safetensors file or shards, from their
    headers alone (no tensor read); None when the folder cannot be read this way."""
    header = stored_header(folder)
    return None if header is None else {k: list(v["shape"]) for k, v in header.items()}


def stored_header(folder: str | Path) -> dict[str, dict] | None:
    """Every tensor's header entry (``{"dtype": "BF16", "shape": [...], ...}``) in a model
    folder's safetensors file or shards; None when the folder cannot be read this way."""
    folder = Path(folder)
    files = [folder / "model.safetensors"]
    index = folder / "model.safetensors.index.json"
    try:
        if not files[0].is_file() and index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            files = [folder / f for f in sorted(set(weight_map.values()))]
        if not files or not files[0].is_file():
            return None
        header: dict[str, dict] = {}
        for f in files:
            header |= _safetensors_header(f)
        for entry in header.values():
            list(entry["shape"])  # (a header without shapes is not readable this way)
        return header
    except (OSError, ValueError, TypeError, AttributeError, KeyError, struct.error):
        return None


def _safetensors_header(path: Path) -> dict[str, dict]:
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(min(length, 100 << 20)))
    return {k: v for k, v in header.items() if k != "__metadata__"}


# -- memory ----------------------------------------------------------------------------------

#: What the process needs beside the models: the interpreter, torch and its libraries.
RUNTIME_BYTES = 600 << 20
#: Float32 copies of the largest tensor held beside the models (a block cast to float64 for
#: the certificate, a tensor being converted or written, the matching's matrices).
LARGEST_TENSOR_COPIES = 4
#: Float32 copies of B that ``glmc align`` holds beside A and B at its peak (a fraction):
#: the pair is handed over to weight matching (``AlignOptions.hand_over``), so that A's
#: tensors become the weighted copies its steps read (kept in bfloat16 or float16 where that
#: holds them exactly), B's are freed once moved to the descent's start, the tables only the
#: stream touches once folded into its constant, and B aligned is made from B's folder read
#: again once the matching's copies are freed. Beyond the two models the descent then holds
#: the residual cache's float64 cross-correlations (d × d per MLP matrix) and each worker's
#: unit step (its n × n cost and the unit's tensors moved); loading and the reference logits
#: hold the two models and one layer in float64, writing B aligned and its stock form.
#: Measured (before a bfloat16 pair was held in bfloat16: :data:`HALF_MATCHING_COPIES`) at 1
#: and 2 threads on a Llama pair of TinyLlama-1.1B's widths with 4 of its 22
#: layers (293M parameters each, bfloat16): 3.65 GB at the peak, the reference logits (the
#: descent 3.25 and 3.46 GB; 6.10 GB with the models kept), which extrapolates to about
#: 10.0 GB for the 1.1B pair (A and B 8.8 GB of it; 18.7 GB kept); a float32 checkpoint,
#: none of whose copies is kept in half precision, to about 11.9 GB at 2 threads, which this
#: fraction covers.
MATCHING_COPIES = 0.35
#: The same for a bfloat16 pair that ``glmc align`` loads in bfloat16 (handed over without
#: data: ``load_model``'s ``half``), beside A and B in bfloat16 (2 bytes a parameter, not 4).
#: The matching holds A's weighted copies and B moved in bfloat16 too, in their place, and
#: the residual cache's cross-correlations in float32 (:mod:`glmc.matching.held`), so what
#: it adds is: the cache (d × d × 4 bytes per MLP matrix of d × f parameters: 1.1 GB at
#: TinyLlama-1.1B's d = 2048, f = 5632, a quarter of a float32 copy of B), the
#: fresh tensors moved by a residual step (in bfloat16), and a unit's tensors read into
#: float32 with its n × n buffers, per worker (the part that does not shrink with the pair's
#: dtype); loading adds one part in float32 (``glmc.io.folders.PART_BYTES``). Measured on
#: TinyLlama-1.1B's shape (1.1B parameters each, bfloat16) at 1 thread with weight
#: matching capped at 1 iteration: 6.93 GB at the peak, the matching (loading 5.44 GB),
#: where this estimates 7.8 GB; a second worker adds its unit's tensors and buffers (before
#: the pair was held in bfloat16, its 15-iteration run at 2 threads, 10.75 GB, peaked 0.7 GB
#: above the 1-iteration one at 1 thread), which the margin covers.
HALF_MATCHING_COPIES = 0.4
#: The same for such a pair with A streamed from its files (``glmc align --stream``): beside
#: B in bfloat16 the matching holds no copy of A and keeps the residual cache in files
#: (``WeightMatchingOptions.spill``), so what is left is a unit's tensors (A's made from its
#: files, B's moved) with its n x n buffers and the steps' fresh tensors. Measured on 2 and 4
#: of Llama-2-7B's 32 layers at its widths (bfloat16, 2 threads): 3.96 and 5.00 GB at the
#: peak, which extrapolates per layer to 19.50 GB for the whole pair (an upper bound: on
#: TinyLlama-1.1B the rule overestimated the held pair's peak by 26%), B 13.48 GB of it;
#: this fraction estimates 19.7 GB (benchmarks/README.md).
STREAMED_MATCHING_COPIES = 0.13
#: The same with the models kept in memory (merge; align's methods that read data, heads as
#: circuits): B moved by the starting transform (its descent's start) and B aligned (built
#: while A and B are held). Measured: a 1.1B-parameter pair passes 18.7 GB; A and B are
#: 8.8 GB of it.
KEPT_MATCHING_COPIES = 2


def available_memory() -> int | None:
    """The memory the system can give a new process without swapping, in bytes
    (``MemAvailable`` in ``/proc/meminfo``); None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def pair_memory(a: str | Path, b: str | Path, extra_copies: float = MATCHING_COPIES,
                ranks: tuple[int, int] = (1, 1), half: bool = False,
                stream: bool = False) -> tuple[int, int] | None:
    """What aligning model folder B to A holds at its peak, from the safetensors headers
    alone: (both models in float32, the working set), in bytes; None when a folder's
    headers cannot be read (loading it reports why).

    The working set: ``extra_copies`` more float32 copies of B (:data:`MATCHING_COPIES`
    for ``glmc align``, which hands the pair over to weight matching;
    :data:`KEPT_MATCHING_COPIES` with the models kept in memory, to which a merge adds the
    merged model), :data:`LARGEST_TENSOR_COPIES` copies of the largest tensor and the
    runtime (:data:`RUNTIME_BYTES`). Loading, the reference logits, writing and certifying
    hold at most the models and one layer beside them (:mod:`glmc.verify`; B aligned from a
    handed-over pair is written part by part, :mod:`glmc.io.moved`).

    ``half``: a pair both of whose folders store most parameters in bfloat16 is loaded and
    matched in it (``glmc align``'s pair handed over without data): the models in bfloat16
    and :data:`HALF_MATCHING_COPIES` instead of ``extra_copies``; ``stream`` with it: A
    is streamed from its files (``load_model``'s ``stream``, never held) and the residual
    cache kept in files, so the models count B alone and the working set is
    :data:`STREAMED_MATCHING_COPIES` of it.

    ``ranks``: (processes on this machine, processes in all) of a weight matching spread
    across ranks, each reading its share of the pair (:func:`glmc.matching.spread.load_pair`):
    the machine holds its processes' shares of the pair and of the copies, and each one's
    largest tensors and runtime.
    """
    read = [_stored_sizes(folder) for folder in (a, b)]
    if any(r is None or not r[0] for r in read):
        return None
    sizes = [r[0] for r in read]  # type: ignore[index]
    here, world = ranks
    per_param, held = BYTES_PER_PARAM, sum(sizes[0]) + sum(sizes[1])
    if half and all(r[1] for r in read):  # type: ignore[index]
        per_param = BYTES_PER_PARAM // 2
        extra_copies = STREAMED_MATCHING_COPIES if stream else HALF_MATCHING_COPIES
        held = sum(sizes[1]) if stream else held
    pair = per_param * held * here // world
    beside = here * (LARGEST_TENSOR_COPIES * BYTES_PER_PARAM * max(max(s) for s in sizes)
                     + RUNTIME_BYTES)
    working = int(BYTES_PER_PARAM * extra_copies * sum(sizes[1]) * here / world) + beside
    return pair, working


def _stored_sizes(folder: str | Path) -> tuple[list[int], bool] | None:
    """Each tensor's parameters in a model folder, and whether most are stored in bfloat16
    (the dtype it is then loaded as, ``glmc.io.files.stored_dtype_of``), from the headers;
    None when they cannot be read."""
    header = stored_header(folder)
    if header is None:
        return None
    sizes = {k: math.prod(e["shape"]) for k, e in header.items()}
    bf16 = sum(n for k, n in sizes.items() if header[k].get("dtype") == "BF16")
    return list(sizes.values()), 2 * bf16 > sum(sizes.values())


def check_pair_memory(a: str | Path, b: str | Path, extra_copies: float = MATCHING_COPIES,
                      what: str = "A and B", ranks: tuple[int, int] = (1, 1),
                      half: bool = False, stream: bool | None = False) -> bool:
    """Refuse, before loading, a pair whose estimate (:func:`pair_memory`, also for
    ``half`` and ``stream``) exceeds the memory available (:func:`available_memory`): one
    GlmcError with the estimate, the mode it is for and what would make it fit. Nothing is
    refused when either cannot be read.

    ``stream``: A streamed from its files (a bfloat16 pair, ``half``); None: only where the
    pair held would not fit and streamed would. Returns whether A is streamed."""
    bf16 = half and all(r and r[1] for r in map(_stored_sizes, (a, b)))
    free = available_memory()
    if stream is None:
        held = pair_memory(a, b, extra_copies, ranks, half)
        stream = bf16 and held is not None and free is not None and sum(held) > free
    stream = bool(stream and bf16)
    need = pair_memory(a, b, extra_copies, ranks, half, stream)
    if need is None or free is None or sum(need) <= free:
        return stream
    pair, working = need
    held = f"in {'bfloat16' if bf16 else 'float32'}" + (
        " (B alone: A streamed from its files)" if stream else "")
    raise GlmcError(f"{what} need about {_size(pair)} {held} plus {_size(working)} of "
                    f"working set; this machine has {_size(free)} available: free memory, "
                    f"or use a machine with ≥ {_size_up(pair + working)}")


#: Float32 copies that bringing N models into one frame holds beside them, by frame: (per
#: model, in all). Star and MergeMany run pairwise weight matchings with the models kept
#: (:data:`KEPT_MATCHING_COPIES` of one model) and hold the merged model (one more), MergeMany
#: also the mean of the others (one more). Universe matching holds every model's weighted
#: copy, its relaxed maps (dense n × n per space), their gradients and directions (three per
#: model). These are lower bounds: on 3 GPT-2s of 29.2M parameters (4 layers, d 768, vocab
#: 512), where the d × d and n × n buffers of the matching weigh much against the models,
#: the peaks were 5.6, 9.3 and 20.4 copies of one model above the models themselves
#: (``benchmarks/frames_memory.py``, commit b884186).
FRAME_COPIES = {"star": (0.0, KEPT_MATCHING_COPIES + 1.0),
                "mergemany": (0.0, KEPT_MATCHING_COPIES + 2.0),
                "universe": (3.0, KEPT_MATCHING_COPIES + 1.0)}


def check_models_memory(folders: list[str | Path], frame: str) -> None:
    """Refuse, before loading, N models whose float32 copies and ``frame``'s working set
    (:data:`FRAME_COPIES`, at least) exceed the memory available: one GlmcError with the
    estimate and what would make it fit. Nothing is refused when a folder's headers or the
    memory cannot be read."""
    params = []
    for folder in folders:
        shapes = stored_shapes(folder)
        if not shapes:
            return
        params.append(sum(math.prod(s) for s in shapes.values()))
    free = available_memory()
    if free is None:
        return
    per_model, fixed = FRAME_COPIES.get(frame, FRAME_COPIES["universe"])
    models = BYTES_PER_PARAM * sum(params)
    working = int(BYTES_PER_PARAM * (per_model * sum(params) + fixed * max(params))) + \
        RUNTIME_BYTES
    if models + working <= free:
        return
    raise GlmcError(f"the {len(folders)} models need about {_size(models)} in float32 plus "
                    f"at least {_size(working)} of working set ({frame} frame); this machine "
                    f"has {_size(free)} available: free memory, merge fewer models at once"
                    f"{', or use --frame mergemany' if frame == 'universe' else ''}, or use a "
                    f"machine with ≥ {_size_up(models + working)}")


def _size_up(n: int) -> str:
    """``n`` bytes rounded up to a whole GB (or MB below one GB), for advice."""
    if n < 10**9:
        return f"{-(-n // 10**6)} MB"
    return f"{-(-n // 10**9)} GB"


def _occupied(p: Path) -> bool:
    """Something a user may have made is at ``p``: a folder with entries, a non-empty file."""
    if p.is_dir() and not p.is_symlink():
        return any(p.iterdir())
    if p.is_symlink():
        return True
    return p.exists() and p.stat().st_size > 0


def _existing_folder(p: Path, path: str | Path) -> Path:
    """The nearest existing ancestor of ``p`` (``p`` included), which must be a folder."""
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise GlmcError(f"{path}: cannot be created, {p} is a file and not a folder")
    return p


def _probe_writable(folder: Path, path: str | Path) -> None:
    """Create and remove a temporary file in ``folder`` (works as root and on read-only
    mounts alike, where permission bits alone would mislead)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".glmc-probe-", dir=folder)
    except OSError as e:
        raise GlmcError(f"{path}: cannot write in {folder} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)


def _size(n: int) -> str:
    """``n`` bytes for people (decimal units)."""
    if n < 1000:
        return f"{n} bytes"
    for unit in ("KB", "MB", "GB", "TB"):
        n /= 1000
        if n < 1000 or unit == "TB":
            break
    return f"{n:.1f} {unit}"
