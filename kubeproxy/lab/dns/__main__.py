"""`python -m kubeproxy.lab.dns check|load ...`: the same commands as `kubeproxy dns`."""

from kubeproxy.lab.dns.command_group import dns

dns(prog_name="python -m kubeproxy.lab.dns")
