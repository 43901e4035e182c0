//! Who a GPU user is, on this node: the pods of this node from the Kubernetes API ([`kube`]: a
//! watcher and its cache, a `tracer_core::identity::PodLookup`).
pub mod kube;
