"""The sm_90a builds of the dev/ TF32 scripts (dev/tf32_probe.py, dev/chunk_sm90_tf32.py): load_inline with the
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


def solution_constant(name):
    """A string constant of solution.py (e.g. WGMMA_SYNC_SRC: the warpgroup fence, commit, wait and the
    setmaxnreg moves), read from its source text."""
    for node in ast.parse(open(os.path.join(ROOT, "solution.py")).read()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == name:
            return ast.literal_eval(node.value)
    raise RuntimeError(f"solution.py has no {name}")


def tf32_wgmma(n, rs, zero):
    """One wgmma.m64n{n}k8.f32.tf32.tf32 (SS: two descriptors; RS: A in four .b32 registers, B a descriptor),
    as an overload on the accumulator's size. zero: d = A B with d output only (scale-d 0), else d += A B
    where scale_d != 0. TF32 has no transpose immediates: the tail is scale-d, imm-scale-a, imm-scale-b."""
    regs = n // 2
    outs = ",".join(f"%{i}" for i in range(regs))
    if rs:
        a, b, sc = "{" + ",".join(f"%{regs + i}" for i in range(4)) + "}", f"%{regs + 4}", f"%{regs + 5}"
        ins, sig = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), ', "const uint32_t (&a)[4], uint64_t db"
    else:
        a, b, sc = f"%{regs}", f"%{regs + 1}", f"%{regs + 2}"
        ins, sig = '"l"(da), "l"(db), ', "uint64_t da, uint64_t db"
    ins += '"r"(0)' if zero else '"r"(scale_d)'
    outs_c = ", ".join(f'"{"=" if zero else "+"}f"(d[{i}])' for i in range(regs))
    body = (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, {sc}, 0;\\n'
            f'wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 {{{outs}}}, {a}, {b}, p, 1, 1;\\n}}\\n"'
            f' : {outs_c} : {ins});')
    name = f"wg_{'rs' if rs else 'ss'}{'_z' if zero else ''}"
    return (f"__device__ __forceinline__ void {name}(float (&d)[{regs}], {sig}{'' if zero else ', int scale_d'}) {{\n"
            f"#ifdef GR_WGMMA\n  {body}\n#endif\n}}\n")


def tf32_wgmma_src(rs_forms=(False, True)):
    """The TF32 wgmma forms (N = 64 and 128; SS and / or RS; accumulating and zeroing) and rs_terms, the k-step of
    an RS product in TERMS terms (hi hi, + hi lo + lo hi for 3); the first k-step overwrites d. CUDA source."""
    forms = "".join(tf32_wgmma(n, rs, z) for n in (64, 128) for rs in rs_forms for z in (False, True))
    return forms + r"""
template <int TERMS, int N>
__device__ __forceinline__ void rs_terms(float (&d)[N], const uint32_t (&ah)[4], const uint32_t (&al)[4], uint64_t bh,
                                         uint64_t bl, bool first) {
  if (first) wg_rs_z(d, ah, bh);
  else wg_rs(d, ah, bh, 1);
  if constexpr (TERMS == 3) {
    wg_rs(d, ah, bl, 1);
    wg_rs(d, al, bh, 1);
  }
}
"""


def summarise_ptxas(log, namespace):
    """Per entry function: registers, stack, spills; and every warning line (nvcc --ptxas-options=-v), the
    kernels' names demangled without `namespace`::(anonymous namespace)."""
    strip = rf"^(void )?{namespace}::\(anonymous namespace\)::"
    rows, cur = [], None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            cur = {"kernel": m.group(1)}
            rows.append(cur)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur is not None:
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
    flags = ["-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "--ptxas-options=-v"]
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


def print_build(summary, launch_regs=None):
    """The build line, each kernel's registers / stack / spills (flagged when not `launch_regs`, where a
    setmaxnreg split assumes that count), and the warnings."""
    print(f"build: {'compiled' if summary['fresh_build'] else 'cached'} in {summary['build_s']} s ({summary['module']})")
    if not summary["kernels"]:
        print("  (no ptxas log: delete the cached build to see registers and spills)")
    for r in summary["kernels"]:
        regs = r.get("registers", "?")
        note = "" if launch_regs is None or regs in (launch_regs, "?") else \
            f"  <-- NOT {launch_regs}: setmaxnreg.inc would wait for registers that do not exist"
        print(f"  {regs:>4} regs  stack {r.get('stack', '?'):>4}  spill st/ld "
              f"{r.get('spill_stores', '?')}/{r.get('spill_loads', '?')}  {r['kernel']}{note}")
    for w in summary["warnings"]:
        print(f"  WARNING {w}")
    print(f"  ptxas warnings: {len(summary['warnings'])}", flush=True)
