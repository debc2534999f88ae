"""strategy=hsdp: FSDP2 on a 2-D mesh, parameters sharded within a node and replicated across nodes.

Each node's ranks hold 1/P of every sharded tensor (P: the processes per node), gathered over the
node's fast links, and the nodes are replicas whose gradients are all-reduced: less traffic across
nodes than fsdp over every rank, less memory per GPU than ddp. The mesh is (replicas, shard size):
`hsdp.shard_size` ranks per shard group, by default each node's processes (NNODES x NPROC_PER_NODE
gives NNODES replicas). Everything else is fsdp's: blocks, precision, offload, sharded checkpoints,
which resume under fsdp or ddp, and theirs under hsdp.
"""

from __future__ import annotations

from typing import Any

import torch

from ...common.errors import ConfigError
from ...config.sharding import hsdp_of
from ..distributed.process_group import env_int
from .fsdp import FSDP


class HSDP(FSDP):
    name = "hsdp"

    def shard_size(self) -> int:
        return hsdp_of(self.config).shard_size or self.env.local_world_size

    def check(self, use_cuda: bool) -> None:
        super().check(use_cuda)
        nodes = env_int("GROUP_WORLD_SIZE", 0)  # torchrun's count of nodes (agents); 0: not under torchrun
        env = self.env
        if not hsdp_of(self.config).shard_size and nodes and env.world_size != env.local_world_size * nodes:
            # Nodes of different sizes: each would see another shard size, some refuse and the others wait for
            # them until dist.timeout_s. Every node sees the sum differ from its own share: all refuse at once.
            raise ConfigError(
                f"hsdp shards over each node's processes, and the nodes were launched with different numbers of them "
                f"({env.world_size} processes on {nodes} nodes, {env.local_world_size} on this one): give every node "
                "the same NPROC_PER_NODE, or set hsdp.shard_size"
            )
        size = self.shard_size()
        if self.env.world_size % size:
            raise ConfigError(
                f"hsdp.shard_size={size} does not divide the {self.env.world_size} ranks into shard groups: give a "
                "divisor of the world size (0: each node's processes)"
            )

    def mesh(self, device: torch.device) -> Any:
        """(replicas, shard size): shard within a group of consecutive ranks (a node), replicate across."""
        from torch.distributed.device_mesh import init_device_mesh

        size = self.shard_size()
        return init_device_mesh(device.type, (self.env.world_size // size, size), mesh_dim_names=("replicate", "shard"))

    def describe_mesh(self) -> str:
        size = self.shard_size()
        return f"over {size} ranks, replicated {self.env.world_size // size} times"


STRATEGY = HSDP
