"""The KubeProxyConfiguration file's fields as pydantic models (upstream's v1alpha1 types).

Apart from proxy/config.py so that only `--config` pays for pydantic (0.1 s of imports):
`kubeproxy render` and every command without a config file start without it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class _Loose(BaseModel):
    """A section upstream defines that we accept without using its contents."""

    model_config = ConfigDict(extra="allow")


class _SyncSection(_Strict):
    masqueradeAll: bool | None = None
    masqueradeBit: int | None = None
    localhostNodePorts: bool | None = None
    syncPeriod: str | None = None
    minSyncPeriod: str | None = None


class _DetectLocal(_Strict):
    bridgeInterface: str | None = None
    interfaceNamePrefix: str | None = None


class _ClientConnection(_Strict):
    kubeconfig: str | None = None
    acceptContentTypes: str | None = None
    contentType: str | None = None
    qps: float | None = None
    burst: int | None = None


class _Conntrack(_Strict):
    maxPerCore: int | None = None
    min: int | None = None
    tcpEstablishedTimeout: str | None = None
    tcpCloseWaitTimeout: str | None = None
    tcpBeLiberal: bool | None = None
    udpTimeout: str | None = None
    udpStreamTimeout: str | None = None


class _LogFormatOptions(_Strict):
    splitStream: bool | None = None
    infoBufferSize: str | int | None = None


class _LogOptions(_Strict):
    text: _LogFormatOptions | None = None
    json_: _LogFormatOptions | None = Field(default=None, alias="json")


class _Logging(_Strict):
    """component-base's LoggingConfiguration."""

    format: str | None = None
    flushFrequency: str | int | None = None
    verbosity: int | None = None
    vmodule: list[Any] | None = None
    options: _LogOptions | None = None


class _KubeProxyConfiguration(_Strict):
    apiVersion: str
    kind: str
    mode: str | None = None
    hostnameOverride: str | None = None
    clusterCIDR: str | None = None
    detectLocalMode: str | None = None
    detectLocal: _DetectLocal | None = None
    iptables: _SyncSection | None = None
    nftables: _SyncSection | None = None
    nodePortAddresses: list[str] | None = None
    healthzBindAddress: str | None = None
    metricsBindAddress: str | None = None
    clientConnection: _ClientConnection | None = None
    featureGates: dict[str, bool] | None = None
    bindAddress: str | None = None
    bindAddressHardFail: bool | None = None
    enableProfiling: bool | None = None
    showHiddenMetricsForVersion: str | None = None
    configSyncPeriod: str | None = None
    oomScoreAdj: int | None = None
    conntrack: _Conntrack | None = None
    logging: _Logging | None = None
    ipvs: _Loose | None = None
    # Fields upstream keeps for other platforms or removed modes: accepted, never used.
    portRange: str | None = None
    winkernel: _Loose | None = None
    windowsRunAsService: bool | None = None
    udpIdleTimeout: str | None = None
    syncPeriod: str | None = Field(default=None)
    minSyncPeriod: str | None = Field(default=None)
