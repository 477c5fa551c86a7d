# Runs inside the VM (sh, cwd = the shared results folder). Loads the host's IPVS render of the
# explain world (world.ipset, world.iptables, world.ipvs, world.addresses) into a fresh `kx`
# namespace, as the proxy would leave it, then asks `kubeproxy explain --live` about each Service.
set -eu
REPO=$(cat repo_path)
ip netns add kx; ip -n kx link set lo up
ip -n kx link add eth0 type dummy; ip -n kx link set eth0 up; ip -n kx addr add 192.168.0.2/24 dev eth0
ip -n kx link add cni0 type dummy; ip -n kx link set cni0 up; ip -n kx addr add 10.244.1.1/24 dev cni0
ip -n kx route add default via 192.168.0.1 dev eth0
ip -n kx link add kube-ipvs0 type dummy
for a in $(cat world.addresses); do ip -n kx addr add "$a/32" dev kube-ipvs0; done
ip netns exec kx ipset restore -exist < world.ipset
ip netns exec kx iptables-restore --noflush < world.iptables
ip netns exec kx ipvsadm-restore < world.ipvs
ip netns exec kx ipvsadm-save -n > kernel.ipvs
ip netns exec kx iptables-save > kernel.iptables
for svc in $(cat services); do
  f=$(echo "$svc" | tr / _)
  # shellcheck disable=SC2046  # node_flags is one flag or value per word, none with spaces
  rc=0; "$REPO/.venv/bin/kubeproxy" explain "$svc" --live --netns kx --manifests world.yaml --json \
    $(cat node_flags) > "live-$f.json" 2> "live-$f.err" || rc=$?
  echo "$rc" > "live-$f.rc"
done
# shellcheck disable=SC2046
rc=0; "$REPO/.venv/bin/kubeproxy" doctor --live --netns kx --manifests world.yaml --json $(cat node_flags) \
  > doctor.json 2> doctor.err || rc=$?
echo "$rc" > doctor.rc
