# Runs inside the VM (sh, cwd = the shared results folder). Builds three namespaces:
#   pod (10.244.1.10, serves HTTP on 8080) -- node (runs IpvsProxier) -- client (192.168.0.10)
# then checks a TCP connection through the ClusterIP (from the node) and the NodePort (from the client).
set -eu
REPO=$(cat repo_path)
RES=$(pwd)
for ns in node pod client; do ip netns add $ns; ip -n $ns link set lo up; done
ip link add n0 netns node type veth peer name p0 netns pod
ip link add n1 netns node type veth peer name c0 netns client
ip -n node addr add 10.244.1.1/24 dev n0; ip -n node link set n0 up
ip -n pod addr add 10.244.1.10/24 dev p0; ip -n pod link set p0 up; ip -n pod route add default via 10.244.1.1
ip -n node addr add 192.168.0.2/24 dev n1; ip -n node link set n1 up
ip netns add pod2; ip -n pod2 link set lo up
ip link add n2 netns node type veth peer name p0 netns pod2
ip -n node addr add 10.244.2.1/24 dev n2; ip -n node link set n2 up
ip -n pod2 addr add 10.244.2.10/24 dev p0; ip -n pod2 link set p0 up; ip -n pod2 route add default via 10.244.2.1
ip -n client addr add 192.168.0.10/24 dev c0; ip -n client link set c0 up
ip netns exec pod sh -c 'echo pod-says-hello > /tmp/index.html'
ip netns exec pod python3 -m http.server 8080 --bind 10.244.1.10 --directory /tmp >/dev/null 2>&1 &
# Wait for the server by asking it (no fixed sleep): curl retries refused connections.
ip netns exec pod curl -s --retry 60 --retry-connrefused --retry-delay 1 -o /dev/null http://10.244.1.10:8080/
t0=$(date +%s)
ip netns exec node env PYTHONPATH="$REPO" "$REPO/.venv/bin/python" "$REPO/tests/vm/guest_ipvs.py"
echo "sync_seconds=$(( $(date +%s) - t0 ))"
ip netns exec node curl -s -m 10 http://10.96.10.10/index.html > clusterip.out
ip netns exec client curl -s -m 10 http://192.168.0.2:30080/index.html > nodeport.out
ip netns exec node ipvsadm -Ln > ipvsadm_ln.out
ip netns exec node ipset list -n > ipset_names.out
ip netns exec node iptables-save > iptables_save.out
# The host's rendering of the demo cluster (demo.ipset, demo.iptables, demo.ipvs), loaded as is
# into a fresh namespace: the kernel takes every set, rule and virtual server we print.
ip netns add demo; ip -n demo link set lo up
ip -n demo link add eth0 type dummy; ip -n demo link set eth0 up
ip -n demo addr add 192.168.0.2/24 dev eth0; ip -n demo route add 10.244.0.0/16 dev eth0
ip netns exec demo ipset restore -exist < demo.ipset
ip netns exec demo iptables-restore --noflush < demo.iptables
ip netns exec demo ipvsadm-restore < demo.ipvs
ip netns exec demo ipvsadm-save -n > demo_kernel.ipvs
ip netns exec demo ipset save > demo_kernel.ipset
# Dual-stack: one IpvsProxier per family side by side in namespaces of their own (ds-node, ds-pod).
(cd "$REPO" && "$REPO/.venv/bin/python" -m tests.vm.guest_ipvs_dualstack) > "$RES/ipvs_dualstack.json" || true
# Every upstream scenario's rendering (golden-<case>.*, from the host), each into a fresh namespace.
for fam in golden-*.family; do
  c=${fam#golden-}; c=${c%.family}
  ipt=iptables-restore; [ "$(cat "$fam")" = IPv6 ] && ipt=ip6tables-restore
  ip netns add g; ip -n g link set lo up  # the local routing table: IPVS checks each real server against it
  if err=$( { ip netns exec g ipset restore -exist < "golden-$c.ipset" &&
              ip netns exec g $ipt --noflush < "golden-$c.iptables" &&
              ip netns exec g ipvsadm-restore < "golden-$c.ipvs" &&
              ip netns exec g ipvsadm-save -n > "golden-$c.kernel-ipvs"; } 2>&1 ); then
    echo ok > "golden-$c.result"
  else
    echo "$err" > "golden-$c.result"
  fi
  ip netns exec g ipset destroy 2>/dev/null || true
  ip netns del g
done
