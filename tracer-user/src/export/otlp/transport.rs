//! The OTLP exporters of `opentelemetry-otlp` for the chosen protocol: gRPC over tonic, or
//! HTTP/protobuf over hyper (`/v1/metrics`, `/v1/logs` under the endpoint). Built inside the export
//! thread's runtime (tonic's channel and hyper's client spawn their connection tasks there).
use std::collections::HashMap;

use opentelemetry_otlp::{LogExporter, MetricExporter, Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::{Resource, logs::LogExporter as _, metrics::Temporality};

use super::settings::{OtlpProtocol, OtlpSettingError, OtlpSettings};

/// Both exporters.
pub(super) struct Transport {
    pub metrics: MetricExporter,
    pub logs: LogExporter,
}

impl Transport {
    /// Build the exporters (nothing is connected yet: the first export connects).
    pub(super) fn build(s: &OtlpSettings, resource: &Resource) -> Result<Transport, OtlpSettingError> {
        let err = |why: String| OtlpSettingError { key: s.endpoint_source, value: s.endpoint.clone(), why };
        let (metrics, mut logs) = match s.protocol {
            OtlpProtocol::Grpc => {
                let metadata = metadata(s)?;
                let metrics = MetricExporter::builder()
                    .with_tonic()
                    .with_endpoint(&s.endpoint)
                    .with_timeout(s.timeout)
                    .with_metadata(metadata.clone())
                    .with_temporality(Temporality::Cumulative)
                    .build()
                    .map_err(|e| err(e.to_string()))?;
                let logs = LogExporter::builder()
                    .with_tonic()
                    .with_endpoint(&s.endpoint)
                    .with_timeout(s.timeout)
                    .with_metadata(metadata)
                    .build()
                    .map_err(|e| err(e.to_string()))?;
                (metrics, logs)
            }
            OtlpProtocol::HttpProtobuf => {
                let headers: HashMap<String, String> = s.headers.clone().into_iter().collect();
                let metrics = MetricExporter::builder()
                    .with_http()
                    .with_endpoint(format!("{}/v1/metrics", s.endpoint))
                    .with_protocol(Protocol::HttpBinary)
                    .with_timeout(s.timeout)
                    .with_headers(headers.clone())
                    .with_temporality(Temporality::Cumulative)
                    .build()
                    .map_err(|e| err(e.to_string()))?;
                let logs = LogExporter::builder()
                    .with_http()
                    .with_endpoint(format!("{}/v1/logs", s.endpoint))
                    .with_protocol(Protocol::HttpBinary)
                    .with_timeout(s.timeout)
                    .with_headers(headers)
                    .build()
                    .map_err(|e| err(e.to_string()))?;
                (metrics, logs)
            }
        };
        logs.set_resource(resource);
        Ok(Transport { metrics, logs })
    }
}

/// The headers as gRPC metadata; a name or value gRPC cannot carry is a setting error.
fn metadata(s: &OtlpSettings) -> Result<tonic::metadata::MetadataMap, OtlpSettingError> {
    let mut map = tonic::metadata::MetadataMap::new();
    for (k, v) in &s.headers {
        let bad = |why: &str| OtlpSettingError { key: "otlp.headers", value: format!("{k}={v}"), why: why.to_owned() };
        let key = tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
            .map_err(|_| bad("not a valid header name; use letters, digits and -"))?;
        let value = v.parse().map_err(|_| bad("not a valid header value; use printable ASCII"))?;
        map.insert(key, value);
    }
    Ok(map)
}
