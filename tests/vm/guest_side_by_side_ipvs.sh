# Runs inside the VM (sh, cwd = the shared results folder): guest_side_by_side_ipvs.py, upstream's
# binaries from the folder named in the file `upstream_bin`, its report in side_by_side_ipvs.json;
# the file `every` (when given) holds the guest's further arguments (`every`, `random`).
set -u
RES=$(pwd)
REPO=$(cat repo_path)
EVERY=$(cat every 2>/dev/null || true)
cd "$REPO"
# A node loads nf_conntrack at boot: kube-proxy, upstream's as ours, sets nf_conntrack_max first.
modprobe nf_conntrack
t0=$(date +%s)
# The guest and the proxy it starts import the package from this checkout, whatever the venv names.
PYTHONPATH="$REPO" KUBEPROXY_UPSTREAM_BIN=$(cat "$RES/upstream_bin") \
  .venv/bin/python -u -m tests.vm.guest_side_by_side_ipvs "$RES/side_by_side_ipvs.json" $EVERY > "$RES/guest.out" 2>&1
echo "rc=$? seconds=$(( $(date +%s) - t0 ))"
exit 0
