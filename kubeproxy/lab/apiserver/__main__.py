"""`python -m kubeproxy.lab.apiserver`."""

from kubeproxy.lab.apiserver.cli import main

main(prog_name="python -m kubeproxy.lab.apiserver")
