//! Event filters (`gputracer.v1.EventFilter`): checked once when a subscription starts
//! ([`Filters::new`], so a bad filter is an error naming it), then matched per event — from the
//! event's fixed-size [`EventKey`] where that decides ([`Filters::matches_key`]), else from the
//! message ([`Filters::matches`]).
use std::hash::Hasher;

use gpu_tracer_proto::v1;

/// A filter the agent cannot apply as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("{list}[{index}].{field}: an empty value matches nothing; leave the field out instead")]
    Empty { list: &'static str, index: usize, field: &'static str },
    #[error(
        "{list}[{index}].kind: {value} is not an event kind of gputracer.v1 (EventKind 1..={}; 0 is UNSPECIFIED)",
        last_event_kind()
    )]
    UnknownKind { list: &'static str, index: usize, value: i32 },
}

/// The highest `gputracer.v1.EventKind` this build knows (the kinds are numbered from 1 without gaps).
pub fn last_event_kind() -> i32 {
    (1..).take_while(|k| v1::EventKind::try_from(*k).is_ok()).last().unwrap_or(0)
}

/// One checked `EventFilter`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Filter {
    namespace: Vec<String>,
    /// [`namespace_hash`] of each of `namespace`: what the key can rule out.
    namespace_hash: Vec<u32>,
    pod: Vec<String>,
    container: Vec<String>,
    cgroup_id: Vec<u64>,
    cgroup_path_prefix: Vec<String>,
    gpu_minor: Vec<u32>,
    gpu_uuid: Vec<String>,
    kind: Vec<i32>,
    violations_only: bool,
}

/// A subscription's include and exclude filters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filters {
    include: Vec<Filter>,
    exclude: Vec<Filter>,
}

impl Filters {
    /// Checks the request's filters: no empty strings, only known event kinds.
    pub fn new(include: &[v1::EventFilter], exclude: &[v1::EventFilter]) -> Result<Self, FilterError> {
        let check = |list: &'static str, fs: &[v1::EventFilter]| -> Result<Vec<Filter>, FilterError> {
            fs.iter().enumerate().map(|(i, f)| Filter::new(list, i, f)).collect()
        };
        Ok(Filters { include: check("include", include)?, exclude: check("exclude", exclude)? })
    }

    /// Is the event sent: it matches an include filter (or there is none) and no exclude filter.
    pub fn matches(&self, ev: &v1::Event) -> bool {
        (self.include.is_empty() || self.include.iter().any(|f| f.matches(ev)))
            && !self.exclude.iter().any(|f| f.matches(ev))
    }

    /// The same answer as [`matches`](Filters::matches) from the event's key alone when the key
    /// decides it, `None` when only the message can. Filters on `kind`, `cgroup_id`,
    /// `violations_only` and (except for violations) a GPU minor are decided here, as is every
    /// event of a namespace no filter names; `pod`, `container`, `cgroup_path_prefix`, a GPU UUID
    /// and a namespace that does match need the message.
    pub fn matches_key(&self, key: &EventKey) -> Option<bool> {
        let included = if self.include.is_empty() { Some(true) } else { any_match(&self.include, key) };
        match (included, any_match(&self.exclude, key)) {
            (Some(false), _) | (_, Some(true)) => Some(false),
            (Some(true), Some(false)) => Some(true),
            _ => None,
        }
    }

    /// Does every event match (no filter at all)?
    pub fn is_empty(&self) -> bool {
        self.include.is_empty() && self.exclude.is_empty()
    }
}

impl Filter {
    fn new(list: &'static str, index: usize, f: &v1::EventFilter) -> Result<Self, FilterError> {
        let strings = |field: &'static str, v: &[String]| -> Result<Vec<String>, FilterError> {
            if v.iter().any(|s| s.is_empty()) {
                return Err(FilterError::Empty { list, index, field });
            }
            Ok(v.to_vec())
        };
        for &k in &f.kind {
            if k == 0 || v1::EventKind::try_from(k).is_err() {
                return Err(FilterError::UnknownKind { list, index, value: k });
            }
        }
        let gpu = strings("gpu", &f.gpu)?;
        let (minors, uuids): (Vec<&String>, Vec<&String>) = gpu.iter().partition(|g| g.parse::<u32>().is_ok());
        let namespace = strings("namespace", &f.namespace)?;
        Ok(Filter {
            namespace_hash: namespace.iter().map(|n| namespace_hash(n)).collect(),
            namespace,
            pod: strings("pod", &f.pod)?,
            container: strings("container", &f.container)?,
            cgroup_id: f.cgroup_id.clone(),
            cgroup_path_prefix: strings("cgroup_path_prefix", &f.cgroup_path_prefix)?,
            gpu_minor: minors.iter().filter_map(|m| m.parse().ok()).collect(),
            gpu_uuid: uuids.into_iter().cloned().collect(),
            kind: f.kind.clone(),
            violations_only: f.violations_only,
        })
    }

    /// See [`Filters::matches_key`]: `Some` only when [`matches`](Filter::matches) would say the same.
    fn matches_key(&self, key: &EventKey) -> Option<bool> {
        let has = |flag: u8| key.flags & flag != 0;
        if !has(EventKey::HEADER) || (self.violations_only && !has(EventKey::VIOLATION)) {
            return Some(false);
        }
        if (!self.kind.is_empty() && !self.kind.contains(&key.kind))
            || (!self.cgroup_id.is_empty() && !self.cgroup_id.contains(&key.cgroup_id))
            || (!self.namespace_hash.is_empty() && !self.namespace_hash.contains(&key.namespace_hash))
        {
            return Some(false);
        }
        // Strings the key does not hold (a matching namespace hash still needs the name itself).
        let mut decided = self.namespace.is_empty()
            && self.pod.is_empty()
            && self.container.is_empty()
            && self.cgroup_path_prefix.is_empty();
        if !self.gpu_minor.is_empty() || !self.gpu_uuid.is_empty() {
            if has(EventKey::VIOLATION) {
                // The violation's own GPU minor and UUIDs are in the message only.
                decided = false;
            } else if !(has(EventKey::ON_GPU) && self.gpu_minor.contains(&key.gpu_minor)) {
                // Not a violation: only the device node's minor can match.
                return Some(false);
            }
        }
        decided.then_some(true)
    }

    fn matches(&self, ev: &v1::Event) -> bool {
        let Some(h) = ev.header.as_ref() else { return false };
        let violation = violation(ev);
        if self.violations_only && violation.is_none() {
            return false;
        }
        if !self.kind.is_empty() && !self.kind.contains(&h.kind) {
            return false;
        }
        if !self.cgroup_id.is_empty() && !self.cgroup_id.contains(&h.cgroup_id) {
            return false;
        }
        if !self.cgroup_path_prefix.is_empty() && !self.cgroup_path_prefix.iter().any(|p| h.cgroup_path.starts_with(p))
        {
            return false;
        }
        let (ns, pod, container) = pod_names(ev);
        let one_of = |want: &[String], have: &str| want.is_empty() || want.iter().any(|w| w == have);
        if !one_of(&self.namespace, ns) || !one_of(&self.pod, pod) || !one_of(&self.container, container) {
            return false;
        }
        if !self.gpu_minor.is_empty() || !self.gpu_uuid.is_empty() {
            let on_minor = ev
                .device
                .as_ref()
                .is_some_and(|d| d.kind == v1::DeviceKind::Gpu as i32 && self.gpu_minor.contains(&d.minor))
                || violation.is_some_and(|v| v.gpu_minor.is_some_and(|m| self.gpu_minor.contains(&m)));
            let on_uuid = violation.is_some_and(|v| {
                self.gpu_uuid.iter().any(|u| {
                    (!v.gpu_uuid.is_empty() && v.gpu_uuid.starts_with(u.as_str()))
                        || (!v.mig_uuid.is_empty() && v.mig_uuid.starts_with(u.as_str()))
                })
            });
            if !on_minor && !on_uuid {
                return false;
            }
        }
        true
    }
}

/// `Some` when any filter decides a match, `Some(false)` when every one decides none.
fn any_match(filters: &[Filter], key: &EventKey) -> Option<bool> {
    let mut undecided = false;
    for f in filters {
        match f.matches_key(key) {
            Some(true) => return Some(true),
            Some(false) => {}
            None => undecided = true,
        }
    }
    (!undecided).then_some(false)
}

fn violation(ev: &v1::Event) -> Option<&v1::Violation> {
    match &ev.payload {
        Some(v1::event::Payload::Violation(v)) => Some(v),
        _ => None,
    }
}

/// The pod's names the filters compare: the violation's own, else the container identity's.
fn pod_names(ev: &v1::Event) -> (&str, &str, &str) {
    match (violation(ev), ev.header.as_ref().and_then(|h| h.container.as_ref())) {
        (Some(v), _) => (&v.namespace, &v.pod, &v.container),
        (None, Some(c)) => (&c.namespace, &c.pod, &c.container),
        (None, None) => ("", "", ""),
    }
}

/// A hash of a namespace's name, the same for the same name within one process: unequal hashes
/// are unequal names (equal ones are checked on the name).
fn namespace_hash(ns: &str) -> u32 {
    let mut h = std::hash::DefaultHasher::new();
    h.write(ns.as_bytes());
    h.finish() as u32
}

/// What the filters can check of an event without its message: a few fixed-size fields (32
/// bytes), which the event hub keeps with each event's encoding instead of the message, whose
/// strings (cgroup path, container identity) make up most of its size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventKey {
    /// `Header.wall_time_unix_ns` (0 without a header): what `since_unix_ns` compares.
    pub wall_time_unix_ns: u64,
    /// `Header.cgroup_id`.
    pub cgroup_id: u64,
    /// `Header.kind` (`EventKind`).
    pub kind: i32,
    /// The minor of the GPU device node the event is on, when [`ON_GPU`](EventKey::ON_GPU).
    gpu_minor: u32,
    /// [`namespace_hash`] of the namespace the filters compare ([`pod_names`]; "" when none).
    namespace_hash: u32,
    flags: u8,
}

const _: () = assert!(size_of::<EventKey>() == 32);

impl EventKey {
    const HEADER: u8 = 1;
    const VIOLATION: u8 = 2;
    const ON_GPU: u8 = 4;

    /// The key of `ev`.
    pub fn of(ev: &v1::Event) -> Self {
        let Some(h) = ev.header.as_ref() else { return EventKey::default() };
        let gpu = ev.device.as_ref().filter(|d| d.kind == v1::DeviceKind::Gpu as i32);
        let mut flags = EventKey::HEADER;
        if violation(ev).is_some() {
            flags |= EventKey::VIOLATION;
        }
        if gpu.is_some() {
            flags |= EventKey::ON_GPU;
        }
        EventKey {
            wall_time_unix_ns: h.wall_time_unix_ns,
            cgroup_id: h.cgroup_id,
            kind: h.kind,
            gpu_minor: gpu.map_or(0, |d| d.minor),
            namespace_hash: namespace_hash(pod_names(ev).0),
            flags,
        }
    }
}

/// `rm_alloc` / `RM_ALLOC` / `EVENT_KIND_RM_ALLOC` → the EventKind number.
pub fn parse_kind(s: &str) -> Result<i32, String> {
    let upper = s.trim().to_ascii_uppercase().replace('-', "_");
    let name = if upper.starts_with("EVENT_KIND_") { upper } else { format!("EVENT_KIND_{upper}") };
    match v1::EventKind::from_str_name(&name) {
        Some(v1::EventKind::Unspecified) | None => {
            Err(format!("unknown event kind `{s}`; one of: {}", kind_names().join(", ")))
        }
        Some(k) => Ok(k as i32),
    }
}

/// The event kinds' names, as `events --json` and the config files write them (`rm_alloc`).
fn kind_names() -> Vec<String> {
    (1..)
        .map_while(|n| v1::EventKind::try_from(n).ok())
        .map(|k| k.as_str_name().trim_start_matches("EVENT_KIND_").to_ascii_lowercase())
        .collect()
}

/// The JSON schema of a list of event kinds by name (`[[otlp.exclude]] kind = [...]`).
pub(crate) fn kinds_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "array", "items": { "type": "string", "enum": kind_names() } })
}

/// The same, or `["all"]` (`otlp.events`, `api.history_kinds`).
pub(crate) fn kinds_or_all_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut names = kind_names();
    names.push("all".into());
    schemars::json_schema!({ "type": "array", "items": { "type": "string", "enum": names } })
}

/// An `EventFilter` in a config file (e.g. `[[otlp.exclude]]`), with event kinds by name
/// (`rm_alloc`, `violation`, ...). Same meaning as the message's fields.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct FilterConfig {
    pub namespace: Vec<String>,
    pub pod: Vec<String>,
    pub container: Vec<String>,
    pub cgroup_id: Vec<u64>,
    pub cgroup_path_prefix: Vec<String>,
    pub gpu: Vec<String>,
    #[schemars(schema_with = "kinds_schema")]
    pub kind: Vec<String>,
    pub violations_only: bool,
}

impl FilterConfig {
    /// The message; an unknown kind name is an error naming the known ones.
    pub fn to_proto(&self) -> Result<v1::EventFilter, String> {
        Ok(v1::EventFilter {
            namespace: self.namespace.clone(),
            pod: self.pod.clone(),
            container: self.container.clone(),
            cgroup_id: self.cgroup_id.clone(),
            cgroup_path_prefix: self.cgroup_path_prefix.clone(),
            gpu: self.gpu.clone(),
            kind: self.kind.iter().map(|k| parse_kind(k)).collect::<Result<_, _>>()?,
            violations_only: self.violations_only,
        })
    }

    /// Checked [`Filters`] from config lists.
    pub fn filters(include: &[FilterConfig], exclude: &[FilterConfig]) -> Result<Filters, String> {
        let to = |fs: &[FilterConfig]| fs.iter().map(FilterConfig::to_proto).collect::<Result<Vec<_>, _>>();
        Filters::new(&to(include)?, &to(exclude)?).map_err(|e| e.to_string())
    }
}
