"""How to reach the API server: a kubeconfig file or the in-cluster service account, via lightkube.

lightkube does the parts that are easy to get wrong (kubeconfig contexts, CA bundles, client
certificates, exec plugins, rotating service-account tokens); the result is an authenticated
`httpx2.AsyncClient` whose base URL is the API server, which the reflectors use for list and
watch.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx2
import yaml
from lightkube.config.client_adapter import AsyncClient as _adapter_client
from lightkube.config.client_adapter import ConnectionParams, _shallow_asdict, user_auth, verify_cluster
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.config.models import Cluster, User
from lightkube.core.exceptions import ConfigError

from kubeproxy import __version__
from kubeproxy.runtime.version import KUBERNETES_VERSION, VersionInfo
from kubeproxy.sources.http2 import Http2Transport
from kubeproxy.sources.throttle import TokenBucket
from kubeproxy.sources.token_file import TokenFileAuth

# Upstream's shape (rest.DefaultKubernetesUserAgent: `kube-proxy/v1.37.2 (linux/amd64)
# kubernetes/<commit>`) with us in the place of the build: whatever groups clients by the
# product before the first "/" (field managers, audit and log queries) sees kube-proxy.
USER_AGENT = f"kube-proxy/{KUBERNETES_VERSION} ({VersionInfo().platform}) kubeproxy/{__version__}"


class ConnectionConfigError(RuntimeError):
    """The kubeconfig (or in-cluster configuration) cannot be used; the message says why."""


def load_config(
    kubeconfig: str | Path | None = None,
    *,
    context: str | None = None,
    master: str | None = None,
) -> SingleConfig:
    """The connection settings kube-proxy's `--kubeconfig` and `--master` flags describe.

    With neither: the in-cluster service account, then `$KUBECONFIG`, then `~/.kube/config`.
    `master` alone means an unauthenticated server URL; with a kubeconfig it overrides the
    server address only, as upstream does.
    """
    try:
        if kubeconfig is not None:
            config = KubeConfig.from_file(kubeconfig)
        elif master is not None:
            config = KubeConfig.from_one(cluster=Cluster(server=master), user=User())
        else:
            config = KubeConfig.from_env()
        single = config.get(context_name=context)
    except ConfigError as e:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster or default kubeconfig"
        raise ConnectionConfigError(f"cannot load {where}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConnectionConfigError(f"cannot load kubeconfig {kubeconfig or '(default)'}:{where} not valid YAML") from None
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ConnectionConfigError(f"cannot load kubeconfig {kubeconfig or '(default)'}: {e!r}") from None
    if single is None:
        raise ConnectionConfigError(f"kubeconfig {kubeconfig or '(default)'} has no usable context")
    if single.user is None:
        # lightkube insists on a user; an anonymous one is what a context without a user means.
        single = single._replace(user=User())
    if master is not None and kubeconfig is not None:
        old = single.cluster
        cluster = Cluster(
            server=master,
            certificate_auth=old.certificate_auth,
            certificate_auth_data=old.certificate_auth_data,
            insecure=old.insecure,
        )
        single = single._replace(cluster=cluster)
    return single


def connect(
    config: SingleConfig,
    *,
    timeout: float = 10.0,
    trust_env: bool = True,
    qps: float = 5.0,
    burst: int = 10,
    user_agent: str = USER_AGENT,
    http2: bool = True,
) -> httpx2.AsyncClient:
    """An authenticated client for the API server in `config`. The caller closes it (`aclose`).

    `timeout` bounds connecting and ordinary requests; lists and watches set their own read
    timeouts. `qps` and `burst` limit every request but watches as client-go's rate limiter
    (`throttle.py`; kube-proxy's defaults; qps <= 0: no limit). With `http2`, an https server is
    spoken to over one HTTP/2 connection, as client-go does (`http2.py`; HTTP/1.1 where the server
    does not offer HTTP/2).
    """
    params = ConnectionParams(timeout=httpx2.Timeout(timeout), trust_env=trust_env)
    try:
        bucket = TokenBucket(qps, burst) if qps > 0 else None
        if config.cluster.server.startswith("http://"):
            # No TLS on this connection, so no certificate store to load: lightkube's client
            # would build a verifying SSL context anyway (50-150 ms of every start-up).
            auth = user_auth(config.user)
            client = httpx2.AsyncClient(base_url=config.cluster.server, verify=False, auth=auth, **_shallow_asdict(params))
        elif http2:
            # The fallback and the HTTP/2 transport each set their own ALPN: one context each.
            fallback = httpx2.AsyncHTTPTransport(verify=_verify(config, trust_env), trust_env=trust_env)
            transport = Http2Transport(_verify(config, trust_env), fallback)
            client = httpx2.AsyncClient(**{**params.httpx_params(config), "transport": transport})
        else:
            client = _adapter_client(config, params)
        if config.user is not None and config.user.token_file is not None:
            client.auth = TokenFileAuth(Path(config.user.token_file))  # as client-go reads it (token_file.py)
        if bucket is not None:
            bucket.attach(client)
    except (ConfigError, OSError, ValueError) as e:
        raise ConnectionConfigError(f"cannot set up a client for {config.cluster.server}: {e}") from None
    client.headers["User-Agent"] = user_agent
    return client


def _verify(config: SingleConfig, trust_env: bool) -> ssl.SSLContext:
    """The TLS context lightkube makes for `config` (its CA, client certificate, insecure flag)."""
    return verify_cluster(config.cluster, config.user or User(), config.abs_file, trust_env=trust_env)
