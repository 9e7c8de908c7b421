import subprocess, sys
cases = {
 "gpu_ok": "xs=[x.cuda() for x in reference.get_inputs()]; print(s._ext.forward(*xs).shape)",
 "cpu_rank_raw": "xs=reference.get_inputs(); xs[0]=torch.randn(2,5,3); print('ret', s._ext.forward(*xs))",
 "cpu_rank_lasterr": "xs=reference.get_inputs(); xs[0]=torch.randn(2,5,3); r=s._ext.forward(*xs); print('ret', r is None); print(s._ext.last_error())",
 "lasterr_only": "print(repr(s._ext.last_error()))",
 "plan": "print(s._ext.plan(1,2,3,4,5,0))",
 "gpu_rank": "xs=[x.cuda() for x in reference.get_inputs()]; xs[0]=xs[0][...,0]; print('ret', s._ext.forward(*xs))",
 "cpu_int": "xs=reference.get_inputs(); xs[0]=xs[0].int(); print('ret', s._ext.forward(*xs))",
 "cpu_all": "xs=reference.get_inputs(); print('ret', s._ext.forward(*xs))",
 "cpu_full": "xs=reference.get_inputs(); xs[0]=torch.randn(2,5,3); s.gated_recurrence(*xs)",
}
for name, code in cases.items():
    p = subprocess.run([sys.executable, "-X", "faulthandler", "-c", "import torch, reference, solution as s; " + code],
                       capture_output=True, text=True)
    print(f"{name}: rc={p.returncode} out={p.stdout.strip()[-150:]!r} err={p.stderr.strip().splitlines()[-1][-200:] if p.stderr.strip() else ''!r}")
