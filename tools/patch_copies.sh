#!/bin/bash
# Cumulative copies of solution.py for a same-process A/B of kernel patches (dev/*.patch): for each patch, in the
# order given, scratch/ab/NAME/solution.py with it and every patch before it applied (NAME: the file name without
# .patch and a leading chunk_bwd_). Prints the --baseline arguments for tools/bwd_ab.py (the repo's solution.py is
# its "new"); scratch/ travels with `carry: ["scratch"]`.
#   args=$(bash tools/patch_copies.sh dev/chunk_bwd_vec16.patch dev/chunk_bwd_l2prefetch.patch dev/chunk_bwd_masked_mma.patch)
#   python3 tools/bwd_ab.py $args --reps 2
set -euo pipefail
root=$(pwd)
prev=$root/solution.py
args=""
for p in "$@"; do
  name=$(basename "$p" .patch)
  name=${name#chunk_bwd_}
  dir=$root/scratch/ab/$name
  mkdir -p "$dir"
  cp "$prev" "$dir/solution.py"
  (cd "$dir" && patch -s -p1 --no-backup-if-mismatch < "$root/$p")
  args="$args --baseline $name=scratch/ab/$name/solution.py"
  prev=$dir/solution.py
done
echo "$args"
