"""Ray Direct Transport's custom-transport interface, for when Ray is not installed.

ferry.rdt subclasses Ray's own ``TensorTransportManager`` and dataclasses when ``ray`` imports;
without Ray (this machine: Ray is not installable from Debian) it uses these, written from the
interface as Ray documents it (ray.experimental.rdt.tensor_transport_manager): the same class
and method names, parameters, defaults and dataclass fields, so the transport and its tests
behave as they would under Ray. Nothing here is used when Ray is present.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple


@dataclass
class CommunicatorMetadata:
    """Metadata for the communicator (a send/recv pair)."""


@dataclass
class TensorTransportMetadata:
    """Metadata for the tensors of one RDT object.

    tensor_meta: (shape, dtype) of each tensor. tensor_device: their device type ("cpu").
    """
    tensor_meta: List[Tuple[Any, Any]]
    tensor_device: Optional[str] = None


@dataclass
class FetchRequest:
    """A pending or completed fetch: subclasses carry what wait_fetch_complete needs and release
    their resources in __del__."""
    obj_id: str
    tensors: List[Any]


class TensorTransportManager(ABC):
    """Interface with which to implement custom tensor transports."""

    @abstractmethod
    def tensor_transport_backend(self) -> str:
        """The name of the tensor transport backend."""

    @staticmethod
    @abstractmethod
    def is_one_sided() -> bool:
        """True when only the receiver initiates the transfer (Ray then never calls
        send_multiple_tensors)."""

    @staticmethod
    @abstractmethod
    def can_abort_transport() -> bool:
        """True when abort_transport reliably interrupts a transfer in progress."""

    @abstractmethod
    def actor_has_tensor_transport(self, actor) -> bool:
        """Whether `actor` has this transport available."""

    @abstractmethod
    def extract_tensor_transport_metadata(self, obj_id: str,
                                          rdt_object: List[Any]) -> TensorTransportMetadata:
        """On the source actor, when a task returns tensors: what a receiver needs."""

    @abstractmethod
    def get_communicator_metadata(self, src_actor, dst_actor,
                                  backend: Optional[str] = None) -> CommunicatorMetadata:
        """On the owner: metadata for one send/recv between the two actors."""

    @abstractmethod
    def recv_multiple_tensors(self, obj_id: str,
                              tensor_transport_metadata: TensorTransportMetadata,
                              communicator_metadata: CommunicatorMetadata,
                              target_buffers: Optional[List[Any]] = None) -> List[Any]:
        """On the destination actor: receives the tensors (into target_buffers if given)."""

    def fetch_multiple_tensors(self, obj_id: str,
                               tensor_transport_metadata: TensorTransportMetadata,
                               communicator_metadata: CommunicatorMetadata,
                               target_buffers: Optional[List[Any]] = None) -> FetchRequest:
        """Starts a fetch without waiting; the default receives synchronously."""
        tensors = self.recv_multiple_tensors(obj_id, tensor_transport_metadata,
                                             communicator_metadata, target_buffers)
        return FetchRequest(obj_id=obj_id, tensors=tensors)

    def wait_fetch_complete(self, fetch_request: FetchRequest, timeout: float = -1) -> List[Any]:
        """Waits for a fetch and returns its tensors: -1 waits, 0 polls; TimeoutError when
        `timeout` seconds pass."""
        return fetch_request.tensors

    @abstractmethod
    def send_multiple_tensors(self, tensors: List[Any],
                              tensor_transport_metadata: TensorTransportMetadata,
                              communicator_metadata: CommunicatorMetadata):
        """On the source actor, for two-sided transports only."""

    @abstractmethod
    def garbage_collect(self, obj_id: str, tensor_transport_meta: TensorTransportMetadata,
                        tensors: List[Any]):
        """On the source actor, once the object is out of scope."""

    @abstractmethod
    def abort_transport(self, obj_id: str, communicator_metadata: CommunicatorMetadata):
        """Aborts a transfer in progress (when can_abort_transport is True)."""
