"""The sm_90a build of the dev/ TF32 probe (dev/tf32_probe.py): load_inline with the
ptxas report captured (registers, stack, spills, warnings a kernel: a warp-specialised kernel hangs in
setmaxnreg.inc if ptxas gives it other registers than its split assumes), and solution.py's warpgroup helpers
without importing solution (which would compile its core unit). No device query anywhere: `--build-only`
works on a machine without a GPU (set CUDA_HOME where torch guesses /usr/local from an nvcc wrapper)."""
import ast
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from torch.utils.cpp_extension import load_inline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A kernel's {registers, local bytes (spills and stack), max threads a block, static shared memory}: what
# a setmaxnreg split and the launch must agree with (CUDA source, spliced where a script writes FUNC_ATTRS).
FUNC_ATTRS_SRC = r"""
static int func_attrs(const void* fn, int* res) {
  cudaFuncAttributes a;
  const cudaError_t e = cudaFuncGetAttributes(&a, fn);
  if (e != cudaSuccess) return (int)e;
  res[0] = a.numRegs;
  res[1] = (int)a.localSizeBytes;
  res[2] = a.maxThreadsPerBlock;
  res[3] = (int)a.sharedSizeBytes;
  return 0;
}
"""


# The dev/ probes' shared device helpers (CUDA source, spliced where a probe writes PROBE_HELPERS): the no-swizzle
# shared-memory matrix descriptor (start >> 4, LBO >> 4 at bit 16, SBO >> 4 at bit 32; dev/wgmma_probe.py settled
# the reading; the opaque move keeps the compiler from hoisting every descriptor of an unrolled loop into two
# registers each, as solution's sm_desc), its offset form, and a hash for dummy data.
PROBE_HELPERS_SRC = r"""
__device__ __forceinline__ uint64_t sm_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("mov.b32 %0, %0;\n" : "+r"(a));
  return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}
__device__ __forceinline__ uint64_t desc_at(uint64_t d, uint32_t bytes) { return d + (bytes >> 4); }
__device__ __forceinline__ float dummy(uint32_t i) {  // a hash in [-0.5, 0.5): full mantissas, finite
  i *= 2654435761u;
  i ^= i >> 15;
  i *= 0x2c1b3c6du;
  i ^= i >> 12;
  return (float)(i & 0xFFFFFFu) * (1.f / 16777216.f) - 0.5f;
}
"""

# The bf16 tiles of the dev/ backward kernels (after PROBE_HELPERS; needs cuda_bf16.h): a pair split into hi and lo
# terms, and the K-major and MN-major descriptors of a k16 step of a tile stored [k / 8][row][8] or [mn / 8][k][8].
BF16_TILE_SRC = r"""
// x = hi + lo in bf16 pairs: hi = bf16(x), lo = bf16(x - hi); TERMS 1: hi only.
template <int TERMS>
__device__ __forceinline__ void split2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  if constexpr (TERMS == 2) {
    const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - __low2float(h), x1 - __high2float(h));
    lo = *reinterpret_cast<const uint32_t*>(&l);
  } else {
    lo = 0u;
  }
}
__device__ __forceinline__ uint64_t kdesc(const unsigned char* sm, int off, int rows, int kb) {  // K-major, k16 step
  return sm_desc(sm + off + 2 * kb * rows * 16, rows * 16, 128);
}
// MN-major, k16 step: a tile stored [mn / 8][k][8] (rows = its k extent): LBO 128 between core matrices adjacent in
// K, SBO rows x 16 between those adjacent in M / N (solution's mn_desc; B1 checks it for A too).
__device__ __forceinline__ uint64_t mdesc(const unsigned char* sm, int off, int rows, int kb) {
  return sm_desc(sm + off + 2 * kb * 128, 128, rows * 16);
}
"""


def probe_cuda(namespace, forms, body, helpers=PROBE_HELPERS_SRC, includes=("cuda_runtime.h", "cuda_bf16.h")):
    """A dev kernel's CUDA text, its head written once: the includes, GR_WGMMA where the target has wgmma (sm_90a;
    it gates solution.py's wgmma helpers), the namespaces `namespace` and an anonymous one (body closes both),
    solution.py's warpgroup helpers (WGMMA_SYNC_SRC), the wgmma forms, the helpers (PROBE_HELPERS_SRC, and
    BF16_TILE_SRC where the kernel splits bf16 tiles), then body, whose FUNC_ATTRS becomes FUNC_ATTRS_SRC."""
    head = "".join(f"#include <{h}>\n" for h in includes + ("cstdint",))
    return (f"{head}\n#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n#define GR_WGMMA 1\n#endif\n\n"
            f"namespace {namespace} {{\nnamespace {{\n\n{solution_constant('WGMMA_SYNC_SRC')}\n{forms}\n{helpers}\n"
            + body.replace("FUNC_ATTRS", FUNC_ATTRS_SRC))


def solution_constant(name):
    """A string constant of solution.py (e.g. WGMMA_SYNC_SRC: the warpgroup fence, commit, wait and the
    setmaxnreg moves), read from its source text."""
    for node in ast.parse(open(os.path.join(ROOT, "solution.py")).read()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == name:
            return ast.literal_eval(node.value)
    raise RuntimeError(f"solution.py has no {name}")


def solution_source(*names, path=None):
    """solution.py's constants `names`, those built from others and from _wgmma included (WGMMA_SRC,
    BACKWARD_SM90_FP32_SRC, ...): its `def _wgmma` and its upper-case top-level assignments, executed in file order
    in a fresh namespace, from the source text alone (solution is not imported: nothing is compiled). One name: its
    value; several: a tuple. path: another copy of solution.py."""
    tree = ast.parse(open(path or os.path.join(ROOT, "solution.py")).read())
    keep = [node for node in tree.body if (isinstance(node, ast.FunctionDef) and node.name == "_wgmma") or
            (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and
             re.fullmatch(r"[A-Z][A-Z0-9_]*", node.targets[0].id))]
    scope = {}
    exec(compile(ast.Module(keep, []), "solution.py", "exec"), scope)
    missing = [n for n in names if n not in scope]
    if missing:
        raise RuntimeError(f"solution.py has no {', '.join(missing)}")
    return scope[names[0]] if len(names) == 1 else tuple(scope[n] for n in names)


def solution_function(name):
    """A module-level function of solution.py (e.g. _wgmma, the wgmma generator), compiled from its
    source text alone."""
    for node in ast.parse(open(os.path.join(ROOT, "solution.py")).read()).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            scope = {}
            exec(compile(ast.Module([node], []), "solution.py", "exec"), scope)
            return scope[name]
    raise RuntimeError(f"solution.py has no function {name}")


def tf32_wgmma_src(rs_forms=(False, True)):
    """solution.py's TF32 wgmma forms (wgmma_tf32_{ss,rs}[_z]: N = 64 and 128; SS and / or RS; accumulating and
    zeroing) and rs_terms, the k-step of an RS product in TERMS terms. CUDA source."""
    gen = solution_function("_wgmma")
    return "".join(gen(n, rs, 0, z, "tf32") for n in (64, 128) for rs in rs_forms for z in (False, True)) + \
        solution_constant("WGMMA_TF32_SRC")


def summarise_ptxas(log, namespace):
    """Per entry function: registers, stack, spills; and every warning line (nvcc --ptxas-options=-v), the
    kernels' names demangled without `namespace`::(anonymous namespace)."""
    strip = rf"^(void )?{namespace}::\(anonymous namespace\)::"
    rows, cur, props = [], None, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            cur = {"kernel": m.group(1)}
            rows.append(cur)
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props = m.group(1)  # (a called .func's stack line follows its own header: not the entry's)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur is not None and props in (None, cur["kernel"]):
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur is not None:
            cur["registers"] = int(m.group(1))
    demangled = {}
    mangled = sorted({r["kernel"] for r in rows} | set(re.findall(r"'(_Z[^']+)'", log)))
    if mangled and shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True).stdout.splitlines()
        if len(out) == len(mangled):
            demangled = dict(zip(mangled, out))
    for r in rows:
        r["kernel"] = re.sub(strip, "", demangled.get(r["kernel"], r["kernel"]))
    warnings = []
    for ln in log.splitlines():
        if not re.search(r"warning|C75\d\d", ln, re.I):
            continue
        ln = re.sub(r"^ptxas info\s*:\s*", "", ln.strip())
        ln = re.sub(r"'(_Z[^']+)'", lambda m: re.sub(strip + r"|\(.*$", "", demangled.get(m.group(1), m.group(1))), ln)
        ln = re.sub(r" in around line \d+", "", ln)
        if ln not in warnings:
            warnings.append(ln)
    return {"kernels": rows, "warnings": warnings}


def build(name, cpp_sources, cuda_sources, functions, namespace, verbose=False):
    """Compiles (or loads from TORCH_EXTENSIONS_DIR) the extension `name` for sm_90a. Returns (module, ptxas
    summary); the log of a fresh build is kept beside the module (ptxas_log.txt) for cached loads."""
    flags = ["-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "--ptxas-options=-v",
             "-lineinfo"]  # (source lines in compute-sanitizer's and ncu's reports; the code is the same)
    lean = {"no_implicit_headers": True} if "no_implicit_headers" in inspect.signature(load_inline).parameters else {}
    t0 = time.time()
    sys.stdout.flush()
    with tempfile.TemporaryFile() as tmp:
        # torch prints the ninja / nvcc output (the ptxas lines) to fd 1 only when verbose: capture it there.
        saved = os.dup(1)
        os.dup2(tmp.fileno(), 1)
        err = None
        try:
            mod = load_inline(name, cpp_sources=cpp_sources, cuda_sources=cuda_sources, functions=functions,
                              extra_cflags=["-O3"], extra_cuda_cflags=flags, verbose=True, **lean)
        except Exception as e:  # noqa: BLE001 (printed below with the build log)
            err = e
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        log = tmp.read().decode(errors="replace")
    if err is not None:
        print(log)
        raise err
    path = os.path.join(os.path.dirname(mod.__file__), "ptxas_log.txt")
    fresh = "ptxas info" in log
    if fresh:
        with open(path, "w") as f:
            f.write(log)
    elif os.path.exists(path):
        with open(path) as f:
            log = f.read()
    if verbose:
        print(log)
    summary = summarise_ptxas(log, namespace)
    summary.update(fresh_build=fresh, build_s=round(time.time() - t0, 1), module=mod.__file__)
    return mod, summary


def print_build(summary, launch_regs=None, split_kernels=""):
    """The build line, each kernel's registers / stack / spills (flagged when not `launch_regs`, where a
    setmaxnreg split assumes that count; with split_kernels, only kernels whose names start with it), and the
    warnings."""
    print(f"build: {'compiled' if summary['fresh_build'] else 'cached'} in {summary['build_s']} s ({summary['module']})")
    if not summary["kernels"]:
        print("  (no ptxas log: delete the cached build to see registers and spills)")
    for r in summary["kernels"]:
        regs = r.get("registers", "?")
        checked = launch_regs is not None and r["kernel"].startswith(split_kernels)
        note = "" if not checked or regs in (launch_regs, "?") else \
            f"  <-- NOT {launch_regs}: setmaxnreg.inc would wait for registers that do not exist"
        print(f"  {regs:>4} regs  stack {r.get('stack', '?'):>4}  spill st/ld "
              f"{r.get('spill_stores', '?')}/{r.get('spill_loads', '?')}  {r['kernel']}{note}")
    for w in summary["warnings"]:
        print(f"  WARNING {w}")
    print(f"  ptxas warnings: {len(summary['warnings'])}", flush=True)


def run_probes(probes, mod, args, result, json_name, only=()):
    """Each (name, fn) of probes (a name in `only`, or all): result[name] = fn(mod, args), saved to $OUT/json_name
    after each. A probe's failure is its result and the next probes still run, unless it left a sticky CUDA error
    (every later launch would fail too): those are marked skipped."""
    import traceback
    import torch
    from tools.common import save
    poisoned = None
    for name, fn in probes:
        if only and name not in only:
            continue
        if poisoned is not None:
            result[name] = {"skipped": f"CUDA context poisoned by {poisoned}"}
            print(f"{name}: skipped (the CUDA context was poisoned by {poisoned})", flush=True)
            continue
        t0 = time.time()
        try:
            result[name] = fn(mod, args)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 (a probe's failure is its result; the next probes still run)
            traceback.print_exc()
            result[name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{name}: FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 (a sticky error: every later launch would fail too)
                poisoned = name
        result[name]["seconds"] = round(time.time() - t0, 2)
        save(json_name, result)
