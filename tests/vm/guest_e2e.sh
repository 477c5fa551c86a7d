# Runs inside the VM (sh, cwd = the shared results folder): the e2e scenarios of guest_e2e.py in
# the modes named in the file `modes`, then the host's own live suite in the modes of `live_modes`
# (tests/e2e/test_live_proxy.py, tests selected by `live_select`), each one pytest run with a
# JUnit XML result the host parses per scenario.
set -u
REPO=$(cat repo_path)
cd "$REPO"
# A node loads nf_conntrack at boot (kops, kubeadm's prerequisites): kube-proxy, upstream's as ours,
# sets net/netfilter/nf_conntrack_max before anything loads it, and stops when the file is missing.
modprobe nf_conntrack
t0=$(date +%s)
KUBEPROXY_VM_MODES=$(cat /vmresults/modes) KUBEPROXY_VM_RESULTS=/vmresults \
  .venv/bin/python -u -m pytest -q -p no:cacheprovider --timeout 900 --durations=0 -o junit_family=xunit1 --junitxml=/vmresults/e2e.xml \
  -k "$(cat /vmresults/select)" tests/vm/guest_e2e.py > /vmresults/e2e.out 2>&1
t1=$(date +%s)
echo "e2e_seconds=$((t1 - t0))"
if [ -s /vmresults/live_select ]; then
  .venv/bin/python -u -m pytest -q -p no:cacheprovider --timeout 900 --durations=0 -o junit_family=xunit1 --junitxml=/vmresults/live.xml \
    tests/e2e/test_live_proxy.py -k "$(cat /vmresults/live_select)" > /vmresults/live.out 2>&1
  echo "live_seconds=$(( $(date +%s) - t1 ))"
fi
exit 0
