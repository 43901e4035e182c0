//! The machinery every domain file of the mapping uses: the [`ToProto`] / [`FromProto`] pair a
//! model type implements once for both directions, the [`Codec`]s that carry one field each way,
//! and the [`wire_message!`] and [`wire_enum!`] macros that write both directions of a plain
//! struct or enum from one list of its fields or variants.
//!
//! A field listed in a [`wire_message!`] is one line, read by both the generated `to_proto` and
//! `from_proto`; without a trailing `..`, both generated struct literals are exhaustive, so a field
//! added to the model or to the message and not listed is a compile error, not a silent zero.
use std::{
    collections::{BTreeMap, HashMap},
    hash::Hash,
    path::PathBuf,
    sync::Arc,
};

use super::{OTHER, Result, SnapshotError};

/// A model type as its `gputracer.v1` message.
pub(super) trait ToProto {
    type Proto;
    fn to_proto(&self) -> Self::Proto;
}

/// A model type back from its message; implemented next to [`ToProto`] so the two directions of
/// a type sit side by side (and, for [`wire_message!`] types, come from one field list).
pub(super) trait FromProto: ToProto + Sized {
    fn from_proto(p: Self::Proto) -> Result<Self>;
}

/// A model enum as the number of its generated twin, and back (`UNSPECIFIED` and unknown
/// numbers are errors naming `field`, the `Message.field` that held it).
pub(super) trait WireEnum: Copy + Sized {
    fn to_wire(self) -> i32;
    fn from_wire(value: i32, field: &'static str) -> Result<Self>;
}

/// How one field of a model type (`T`) becomes the field of its message (`P`) and back. `field`
/// names the message's field (`Message.field`) in errors.
pub(super) trait Codec<T, P> {
    fn write(&self, v: &T) -> P;
    fn read(&self, p: P, field: &'static str) -> Result<T>;
}

/// The same type on both sides (numbers, strings, optional scalars, lists of scalars).
pub(super) struct Same;

impl<T: Clone> Codec<T, T> for Same {
    fn write(&self, v: &T) -> T {
        v.clone()
    }
    fn read(&self, p: T, _: &'static str) -> Result<T> {
        Ok(p)
    }
}

/// A `usize` count as `uint64` (saturating back on a narrower host).
pub(super) struct Count;

impl Codec<usize, u64> for Count {
    fn write(&self, v: &usize) -> u64 {
        *v as u64
    }
    fn read(&self, p: u64, _: &'static str) -> Result<usize> {
        Ok(to_usize(p))
    }
}

/// A sub-message the agent always sets: unset is [`SnapshotError::Missing`].
pub(super) struct Msg;

impl<T: FromProto> Codec<T, Option<T::Proto>> for Msg {
    fn write(&self, v: &T) -> Option<T::Proto> {
        Some(v.to_proto())
    }
    fn read(&self, p: Option<T::Proto>, field: &'static str) -> Result<T> {
        T::from_proto(required(p, field)?)
    }
}

/// A sub-message the agent always sets but an older agent did not: unset reads as the default.
pub(super) struct OrDefault;

impl<T: FromProto + Default> Codec<T, Option<T::Proto>> for OrDefault {
    fn write(&self, v: &T) -> Option<T::Proto> {
        Some(v.to_proto())
    }
    fn read(&self, p: Option<T::Proto>, _: &'static str) -> Result<T> {
        p.map(T::from_proto).transpose().map(Option::unwrap_or_default)
    }
}

/// An optional sub-message.
pub(super) struct Opt;

impl<T: FromProto> Codec<Option<T>, Option<T::Proto>> for Opt {
    fn write(&self, v: &Option<T>) -> Option<T::Proto> {
        v.as_ref().map(T::to_proto)
    }
    fn read(&self, p: Option<T::Proto>, _: &'static str) -> Result<Option<T>> {
        p.map(T::from_proto).transpose()
    }
}

/// An optional sub-message the model shares (`Option<Arc<T>>`).
pub(super) struct Shared;

impl<T: FromProto> Codec<Option<Arc<T>>, Option<T::Proto>> for Shared {
    fn write(&self, v: &Option<Arc<T>>) -> Option<T::Proto> {
        v.as_deref().map(T::to_proto)
    }
    fn read(&self, p: Option<T::Proto>, _: &'static str) -> Result<Option<Arc<T>>> {
        Ok(p.map(T::from_proto).transpose()?.map(Arc::new))
    }
}

/// A repeated sub-message.
pub(super) struct Each;

impl<T: FromProto> Codec<Vec<T>, Vec<T::Proto>> for Each {
    fn write(&self, v: &Vec<T>) -> Vec<T::Proto> {
        v.iter().map(T::to_proto).collect()
    }
    fn read(&self, p: Vec<T::Proto>, _: &'static str) -> Result<Vec<T>> {
        p.into_iter().map(T::from_proto).collect()
    }
}

/// An enum field (see [`WireEnum`]).
pub(super) struct Enum;

impl<T: WireEnum> Codec<T, i32> for Enum {
    fn write(&self, v: &T) -> i32 {
        v.to_wire()
    }
    fn read(&self, p: i32, field: &'static str) -> Result<T> {
        T::from_wire(p, field)
    }
}

/// A sorted map as a protobuf map.
pub(super) struct Map;

impl<K: Clone + Ord + Eq + Hash, V: Clone> Codec<BTreeMap<K, V>, HashMap<K, V>> for Map {
    fn write(&self, v: &BTreeMap<K, V>) -> HashMap<K, V> {
        v.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
    fn read(&self, p: HashMap<K, V>, _: &'static str) -> Result<BTreeMap<K, V>> {
        Ok(p.into_iter().collect())
    }
}

/// Counts keyed by names from a fixed set (`&'static str`): back, the names of the set, and those
/// under any other name added up under [`OTHER`].
pub(super) struct Counts<'a>(pub(super) &'a [&'static str]);

impl Codec<BTreeMap<&'static str, u64>, HashMap<String, u64>> for Counts<'_> {
    fn write(&self, v: &BTreeMap<&'static str, u64>) -> HashMap<String, u64> {
        v.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }
    fn read(&self, p: HashMap<String, u64>, _: &'static str) -> Result<BTreeMap<&'static str, u64>> {
        let mut out = BTreeMap::new();
        for (name, n) in p {
            let v: &mut u64 = out.entry(static_name(&name, self.0)).or_default();
            *v = v.saturating_add(n);
        }
        Ok(out)
    }
}

/// A path as a string.
pub(super) struct Path;

impl Codec<PathBuf, String> for Path {
    fn write(&self, v: &PathBuf) -> String {
        v.display().to_string()
    }
    fn read(&self, p: String, _: &'static str) -> Result<PathBuf> {
        Ok(PathBuf::from(p))
    }
}

/// Both directions of a struct whose fields map one to one onto a message's:
///
/// ```text
/// wire_message! {
///     Model => Message {          // the model type => the `gputracer.v1` message it is
///         lost,                   // the same name on both sides, carried as is (codec `Same`)
///         total => total_bytes,   // renamed in the message, carried as is
///         usage: Msg,             // the same name, carried by the codec `Msg`
///         devices => gpus: Each,  // renamed, and carried by the codec `Each`
///         ..                      // optional, last: model fields not listed read back as default
///     }
/// }
/// ```
///
/// Implements [`ToProto`] and [`FromProto`]; a `Codec`'s errors name the field as
/// `Message.field`.
macro_rules! wire_message {
    ($model:ty => $proto:ident { $($body:tt)* }) => {
        $crate::wire::snapshot::codec::wire_message!(@munch $model, $proto, [] [] $($body)*);
    };
    // One field at a time into `(model field, message field, codec)`.
    (@munch $m:ty, $p:ident, [$($done:tt)*] [] $f:ident => $pf:ident : $c:expr $(, $($rest:tt)*)?) => {
        $crate::wire::snapshot::codec::wire_message!(@munch $m, $p, [$($done)* ($f, $pf, $c)] [] $($($rest)*)?);
    };
    (@munch $m:ty, $p:ident, [$($done:tt)*] [] $f:ident => $pf:ident $(, $($rest:tt)*)?) => {
        $crate::wire::snapshot::codec::wire_message!(
            @munch $m, $p, [$($done)* ($f, $pf, $crate::wire::snapshot::codec::Same)] [] $($($rest)*)?
        );
    };
    (@munch $m:ty, $p:ident, [$($done:tt)*] [] $f:ident : $c:expr $(, $($rest:tt)*)?) => {
        $crate::wire::snapshot::codec::wire_message!(@munch $m, $p, [$($done)* ($f, $f, $c)] [] $($($rest)*)?);
    };
    (@munch $m:ty, $p:ident, [$($done:tt)*] [] $f:ident $(, $($rest:tt)*)?) => {
        $crate::wire::snapshot::codec::wire_message!(
            @munch $m, $p, [$($done)* ($f, $f, $crate::wire::snapshot::codec::Same)] [] $($($rest)*)?
        );
    };
    (@munch $m:ty, $p:ident, [$($done:tt)*] [] .. $(,)?) => {
        $crate::wire::snapshot::codec::wire_message!(@munch $m, $p, [$($done)*] [..]);
    };
    // Every field read: both directions.
    (@munch $model:ty, $proto:ident, [$(($f:ident, $pf:ident, $c:expr))*] [$($rest:tt)?]) => {
        impl $crate::wire::snapshot::codec::ToProto for $model {
            type Proto = ::gpu_tracer_proto::v1::$proto;
            fn to_proto(&self) -> Self::Proto {
                use $crate::wire::snapshot::codec::Codec as _;
                ::gpu_tracer_proto::v1::$proto { $($pf: $c.write(&self.$f),)* }
            }
        }

        impl $crate::wire::snapshot::codec::FromProto for $model {
            fn from_proto(p: Self::Proto) -> $crate::wire::snapshot::Result<Self> {
                use $crate::wire::snapshot::codec::Codec as _;
                Ok(Self {
                    $($f: $c.read(p.$pf, concat!(stringify!($proto), ".", stringify!($pf)))?,)*
                    $($rest Default::default())?
                })
            }
        }
    };
}
pub(super) use wire_message;

/// Both directions of a model enum and its generated twin with the same variant names.
macro_rules! wire_enum {
    ($enum:ident => $proto:ident [$($v:ident),+ $(,)?]) => {
        impl $crate::wire::snapshot::codec::WireEnum for $enum {
            fn to_wire(self) -> i32 {
                use ::gpu_tracer_proto::v1::$proto as P;
                let value = match self {
                    $($enum::$v => P::$v),+
                };
                value.into()
            }

            fn from_wire(value: i32, field: &'static str) -> $crate::wire::snapshot::Result<Self> {
                use ::gpu_tracer_proto::v1::$proto as P;
                Ok(match $crate::wire::snapshot::codec::known(value, field)? {
                    P::Unspecified => return $crate::wire::snapshot::codec::unspecified(field),
                    $(P::$v => $enum::$v),+
                })
            }
        }
    };
}
pub(super) use wire_enum;

pub(super) fn required<T>(m: Option<T>, field: &'static str) -> Result<T> {
    m.ok_or(SnapshotError::Missing { field })
}

/// The generated enum for `value`; the caller still turns its `Unspecified` into an error.
pub(super) fn known<E: TryFrom<i32>>(value: i32, field: &'static str) -> Result<E> {
    E::try_from(value).map_err(|_| SnapshotError::InvalidEnum { field, value })
}

pub(super) fn unspecified<T>(field: &'static str) -> Result<T> {
    Err(SnapshotError::Unspecified { field })
}

pub(super) fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// A received name as the matching name of `known`, or [`OTHER`].
pub(super) fn static_name(name: &str, known: &[&'static str]) -> &'static str {
    known.iter().copied().find(|k| *k == name).unwrap_or(OTHER)
}

pub(super) fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}
