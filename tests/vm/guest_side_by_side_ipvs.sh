# Runs inside the VM (sh, cwd = the shared results folder): guest_side_by_side_ipvs.py, upstream's
# binaries from the folder named in the file `upstream_bin`, its report in side_by_side_ipvs.json.
set -u
RES=$(pwd)
REPO=$(cat repo_path)
cd "$REPO"
# A node loads nf_conntrack at boot: kube-proxy, upstream's as ours, sets nf_conntrack_max first.
modprobe nf_conntrack
t0=$(date +%s)
KUBEPROXY_UPSTREAM_BIN=$(cat "$RES/upstream_bin") \
  .venv/bin/python -u -m tests.vm.guest_side_by_side_ipvs "$RES/side_by_side_ipvs.json" > "$RES/guest.out" 2>&1
echo "rc=$? seconds=$(( $(date +%s) - t0 ))"
exit 0
