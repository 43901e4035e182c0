//! The configuration's JSON schema, derived from [`Config`] itself (schemars reads the same types,
//! serde attributes and doc comments the loader uses), so the two cannot drift: every key with its
//! type, default, range and allowed values, unknown keys refused.
//!
//! Its user is the Helm chart: `values.schema.json` carries it as `definitions.agentConfig`, the
//! schema of the chart's `config` value, so a typo or an out-of-range value fails `helm install`
//! with the key's path instead of installing an agent that exits on start (or, before this, a
//! value the chart silently dropped). The test `chart_schema_is_the_agent_config` in
//! `config/tests.rs` compares the chart's copy with [`config_schema`]; `GOLDEN_UPDATE=1` rewrites
//! it. Draft-07 with every subschema inline: what Helm's validator reads, and a copy that stands
//! alone inside the chart's schema.
use schemars::{Schema, SchemaGenerator, generate::SchemaSettings, json_schema};

use super::{Config, MAX_RING_BUFFER_BYTES};

/// The schema of a whole config file (the chart's `config` value).
pub fn config_schema() -> serde_json::Value {
    let generator = SchemaSettings::draft07()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let mut schema = generator.into_root_schema_for::<Config>().to_value();
    if let Some(o) = schema.as_object_mut() {
        o.insert(
            "title".into(),
            "gpu-tracer agent configuration (config.toml; docs/configuration.md), generated from the agent's own \
             definition"
                .into(),
        );
    }
    schema
}

/// `ring_buffer_bytes`: a power of two from 4 KiB to [`MAX_RING_BUFFER_BYTES`].
pub(crate) fn ring_buffer_bytes(_: &mut SchemaGenerator) -> Schema {
    let sizes: Vec<u32> = (12..=MAX_RING_BUFFER_BYTES.trailing_zeros()).map(|s| 1u32 << s).collect();
    json_schema!({ "type": "integer", "enum": sizes })
}
