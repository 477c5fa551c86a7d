"""kubeproxy: a Kubernetes service proxy and the tools that explain what it does to packets."""

__version__ = "0.1.0"
