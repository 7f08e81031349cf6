"""The Slurm and Kubernetes sides of a leadership term: clients, actuators, sources.

Clients injected at start (the demo, tests) serve every term; otherwise each term
builds its own from the settings and closes it at its end (a kubeconfig exec plugin
that failed, a slurmrestd token that expired: the next term starts afresh). The
sources are seeded from the folded state, so they report only what changed since.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog

from sunkd.domain.events import K8sWorkloadObserved, Payload, SlurmNodeObserved
from sunkd.domain.ports import EventSink
from sunkd.domain.state import ClusterState
from sunkd.runtime.appends import AppendWatch
from sunkd.runtime.config import Settings
from sunkd.runtime.executor import ActuatorExecutor
from sunkd.runtime.ports import Fatal, Source
from sunkd.store.eventlog import StaleLeaderError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from sunkd.kubernetes.actuator import KubernetesActuator
    from sunkd.kubernetes.client import KubeClient
    from sunkd.kubernetes.source import KubernetesSource
    from sunkd.runtime.topology import TopologyDelivery
    from sunkd.slurm.client import SlurmRestClient

log = structlog.get_logger(__name__)

Closers = list[Callable[[], Awaitable[None]]]


def slurm_seed(state: ClusterState) -> dict[str, SlurmNodeObserved]:
    """The node observations the Slurm source should consider already emitted (the
    compact records of nodes in no pool included: they are observed all the same)."""
    seed = {name: node.slurm for name, node in state.nodes.items()
            if node.slurm is not None and not node.slurm_missing}
    seed.update((name, record.slurm) for name, record in state.unpooled.items()
                if record.slurm is not None and not record.slurm_missing)
    return seed


def kubernetes_seed(state: ClusterState) -> list[Payload]:
    """The observations the Kubernetes source should consider already emitted."""
    seed: list[Payload] = []
    for node in state.nodes.values():
        if node.k8s is not None and not node.k8s_missing:
            seed.append(node.k8s)
    # Nodes in no pool are compact records in the fold, observed all the same.
    seed.extend(record.k8s for record in state.unpooled.values()
                if record.k8s is not None and not record.k8s_missing)
    # Every Node's last pod report (rivals' too): a Node the fold holds no report for is
    # not seeded, so the source reports it at its first sync.
    seed.extend(K8sWorkloadObserved(node=k8s_name, pool="", pods=pods)
                for k8s_name, pods in state.pod_reports.items())
    seed.extend(state.k8s_demand.values())
    seed.extend(nodeset for nodeset in state.nodesets.values() if not nodeset.deleted)
    return seed


class Adapters:
    """Builds each term's clients, actuators and sources from the settings."""

    def __init__(self, settings: Settings, *, slurm_client: SlurmRestClient | None = None,
                 kube_client: KubeClient | None = None,
                 slurm_env: dict[str, str] | None = None) -> None:
        self.settings = settings
        self._slurm_client = slurm_client
        self._kube_client = kube_client
        self._slurm_env = slurm_env
        self._topology: TopologyDelivery | None = None
        self._kube_source: KubernetesSource | None = None  # this term's (topology labels)

    def enabled_sources(self) -> list[str]:
        sources = []
        if self.settings.slurm.url or self._slurm_client is not None:
            sources.append("slurm")
        if self.settings.kubernetes.enabled:
            sources.append("kubernetes")
        return sources

    def current_kube(self) -> KubeClient | None:
        """The Kubernetes client this term holds (injected or built), without building."""
        return self._kube_client

    async def slurm(self, closers: Closers) -> SlurmRestClient | None:
        if self._slurm_client is not None:
            return self._slurm_client
        if not self.settings.slurm.url:
            return None
        from sunkd.slurm.client import SlurmRestClient

        client = SlurmRestClient.from_settings(self.settings.slurm)
        self._slurm_client = client

        async def close() -> None:
            await client.close()
            self._slurm_client = None

        closers.append(close)
        return client

    async def kube(self, closers: Closers) -> KubeClient | None:
        if not self.settings.kubernetes.enabled:
            return None
        if self._kube_client is not None:
            return self._kube_client
        from sunkd.kubernetes.client import KubeClient

        kubeconfig = self.settings.kubernetes.kubeconfig
        client = await KubeClient.connect(str(kubeconfig) if kubeconfig else None,
                                          context=self.settings.kubernetes.context)
        self._kube_client = client

        async def close() -> None:
            await client.close()
            self._kube_client = None

        closers.append(close)
        return client

    async def executor(self, may_act: Callable[[], bool], closers: Closers
                       ) -> tuple[ActuatorExecutor, KubernetesActuator | None]:
        """The term's executor, and its Kubernetes actuator (the Nodeset status writer)."""
        slurm_actuator = None
        slurm_client = await self.slurm(closers)
        if slurm_client is not None:
            from sunkd.slurm.actuator import SlurmActuator

            # Writes re-check leadership right before they go out, and give up before
            # may_act() could turn false underneath them: a third of the lease.
            slurm_actuator = SlurmActuator(
                slurm_client, scontrol_env=self._slurm_env, may_write=may_act,
                write_timeout=max(1.0, self.settings.lease_seconds / 3))
        kube_actuator = None
        kube_client = await self.kube(closers)
        if kube_client is not None:
            from sunkd.kubernetes.actuator import KubernetesActuator

            # Events about a Node go to `default`: the API server refuses an Event whose
            # involvedObject is a cluster-scoped Node in any other namespace (422), which
            # the real control plane showed (docs/kubernetes.md).
            kube_actuator = KubernetesActuator(
                kube_client, instance=self.settings.identity, may_act=may_act)
        executor = ActuatorExecutor(slurm_actuator, kube_actuator, slurm_reader=slurm_client)
        return executor, kube_actuator

    async def sources(self, state: ClusterState, sink: EventSink, appends: AppendWatch,
                      closers: Closers) -> list[Source]:
        sources: list[Source] = []
        slurm_client = await self.slurm(closers)
        if slurm_client is not None:
            from sunkd.slurm.source import SlurmSource

            sources.append(SlurmSource(
                slurm_client, appends.wrap("slurm", sink),
                partitions=self.settings.slurm.partitions,
                poll_interval=self.settings.slurm.poll_interval,
                initial_nodes=slurm_seed(state),
                initial_demand=dict(state.slurm_demand),
                # No health seed: the source reports health after its first poll of this
                # term, and only that report makes it fresh again (docs/safety.md, I3).
                initial_health=None))
        kube_client = await self.kube(closers)
        if kube_client is not None:
            from sunkd.kubernetes.source import KubernetesSource

            # Only a fenced append ends the source (our term is over); anything else makes
            # it stale and it recovers by itself.
            gres = self.settings.gres
            self._kube_source = KubernetesSource(
                kube_client, appends.wrap("kubernetes", sink), previous=kubernetes_seed(state),
                fatal_errors=(StaleLeaderError,),
                gres_type_map=gres.type_map if gres.check else None)
            sources.append(self._kube_source)
        return sources

    def topology(self, state: Callable[[], ClusterState], may_write: Callable[[], bool],
                 clock: Callable[[], float], registry: CollectorRegistry
                 ) -> TopologyDelivery | None:
        """The topology file's keeper when `[topology] file` is set (one per process: its
        metrics live as long as the registry), else None. Each round reads the labels from
        the term's Kubernetes source (its Node watch already holds them: no LIST)."""
        if self.settings.topology.file is None:
            return None
        if self._topology is not None:
            return self._topology
        from sunkd.runtime.topology import TopologyDelivery
        from sunkd.slurm.topology import TopologyFile

        file = TopologyFile(self.settings.topology.file, scontrol_env=self._slurm_env,
                            write_timeout=max(1.0, self.settings.lease_seconds / 3),
                            may_write=may_write)

        async def list_nodes() -> list[dict[str, Any]]:
            source = self._kube_source
            if source is None or not source.synced:  # labels unknown: nothing is written
                raise RuntimeError("the Kubernetes source has not listed the Nodes yet")
            return list(source.nodes.values())

        self._topology = TopologyDelivery(self.settings.topology, file, list_nodes, state,
                                          clock=clock, registry=registry)
        return self._topology

    def failed(self, error: Exception, fatal: Fatal) -> None:
        """Building a client failed. A missing or unusable kubeconfig will not fix itself:
        stop with the message. Anything else (an exec plugin that failed just now, too)
        is retried with the next term."""
        from sunkd.kubernetes.kubeconfig import CredentialUnavailable, KubeConfigError

        if isinstance(error, KubeConfigError) and not isinstance(error, CredentialUnavailable):
            fatal(f"kubernetes: {error}", hint="fix the configuration")
        else:
            log.error("daemon.adapter_failed", error=f"{type(error).__name__}: {error}")
