{{/* The chart's name, or nameOverride. */}}
{{- define "gpu-tracer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' name: fullnameOverride, else the release name when it contains the chart's
name, else "<release>-<name>". */}}
{{- define "gpu-tracer.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "gpu-tracer.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The service account the agent runs as (and the ClusterRole is bound to). */}}
{{- define "gpu-tracer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpu-tracer.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gpu-tracer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-tracer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpu-tracer.labels" -}}
{{ include "gpu-tracer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: node-agent
app.kubernetes.io/part-of: gpu-tracer
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Capabilities: the least-privilege set plus the opt-ins (docs/security.md). */}}
{{- define "gpu-tracer.capabilities" -}}
{{- $caps := list "BPF" "PERFMON" "SYS_PTRACE" "DAC_READ_SEARCH" -}}
{{- if and .Values.cudaProbes .Values.cudaPerfEventUprobes }}{{ $caps = append $caps "SYS_ADMIN" }}{{ end -}}
{{- if .Values.memlockCapability }}{{ $caps = append $caps "SYS_RESOURCE" }}{{ end -}}
{{- toJson $caps -}}
{{- end -}}

{{/* The scrape settings shared by the ServiceMonitor and the PodMonitor: `.monitor` is their
values, `.root` the chart's context (TLS and the token apply to both). */}}
{{- define "gpu-tracer.scrape" -}}
{{- $root := .root -}}
{{- with .monitor -}}
path: /metrics
interval: {{ .interval }}
{{- with .scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
honorLabels: {{ .honorLabels }}
{{- if $root.Values.metricsTls.secretName }}
scheme: https
tlsConfig:
  {{- toYaml $root.Values.metricsTls.prometheusTlsConfig | nindent 2 }}
{{- end }}
{{- with $root.Values.metricsToken.secretName }}
authorization:
  type: Bearer
  credentials:
    name: {{ . }}
    key: {{ $root.Values.metricsToken.key }}
{{- end }}
# Per-node numbers: keep the node the agent runs on as a label.
relabelings:
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: node
  # The operator gives each target the agent pod's namespace, pod, container, service and endpoint
  # labels, which would land on every series without its own (the GPUs', the agent's, the bill:
  # gpu_tracer_bill_total{pod="gpu-tracer-x7k2p"}). Workload series carry their own; drop these.
  - action: labeldrop
    regex: (namespace|pod|container|service|endpoint)
  {{- with .relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The configuration keys the chart sets from its other values and its mounts, as YAML: the
user's `config` is written over them (gpu-tracer.toml). */}}
{{- define "gpu-tracer.chartConfig" -}}
dev_dir: /dev
proc_root: /host/proc
cgroup_root: /host/sys/fs/cgroup
driver_version_file: /host/proc/driver/nvidia/version
cuda_libraries: [/host/driver-lib/libcuda.so.1]
families:
  cuda: {{ or .Values.cudaProbes .Values.privileged }}
nvml:
  library: /host/driver-lib/libnvidia-ml.so.1
kubernetes:
  pod_resources_socket: /var/lib/kubelet/pod-resources/kubelet.sock
{{- with .Values.otlp }}
{{- if .endpoint }}
otlp:
  endpoint: {{ .endpoint | quote }}
  protocol: {{ .protocol | quote }}
  metric_export_interval_ms: {{ .metricExportIntervalMs | int64 }}
  {{- if not (kindIs "invalid" .events) }}
  events: {{ toJson .events }}
  {{- end }}
  {{- if .caSecret.name }}
  certificate: "/var/run/gpu-tracer/otlp-ca/{{ .caSecret.key }}"
  {{- end }}
  {{- with .resourceAttributes }}
  resource_attributes: {{ toJson . }}
  {{- end }}
{{- end }}
{{- end }}
{{- if or .Values.metricsTls.secretName .Values.metricsToken.secretName }}
metrics:
  {{- if .Values.metricsTls.secretName }}
  tls_cert: /var/run/gpu-tracer/tls/tls.crt
  tls_key: /var/run/gpu-tracer/tls/tls.key
  {{- end }}
  {{- if .Values.metricsToken.secretName }}
  token_file: "/var/run/gpu-tracer/token/{{ .Values.metricsToken.key }}"
  {{- end }}
{{- end }}
{{- end -}}

{{/* One TOML table from two maps: `.base` (the chart's keys) with `.user` (the `config` value)
written over it key by key at every depth; `.path` is the table's dotted name ("" at the top).
Plain keys first, then each sub-table (TOML's order). Written by hand because Helm's toToml prints
every number of a values file as a float (600.0), which the agent refuses for integer keys. */}}
{{- define "gpu-tracer.toml" -}}
{{- $b := .base | default dict -}}
{{- $u := .user | default dict -}}
{{- $path := .path -}}
{{- $keys := concat (keys $b) (keys $u) | uniq | sortAlpha -}}
{{- range $k := $keys }}
{{- $v := ternary (get $u $k) (get $b $k) (hasKey $u $k) }}
{{- if not (or (kindIs "map" $v) (kindIs "invalid" $v)) }}
{{ include "gpu-tracer.tomlKey" $k }} = {{ include "gpu-tracer.tomlValue" $v }}
{{- end }}
{{- end }}
{{- range $k := $keys }}
{{- $v := ternary (get $u $k) (get $b $k) (hasKey $u $k) }}
{{- if kindIs "map" $v }}
{{- $p := ternary (include "gpu-tracer.tomlKey" $k) (printf "%s.%s" $path (include "gpu-tracer.tomlKey" $k)) (eq $path "") }}

[{{ $p }}]
{{- include "gpu-tracer.toml" (dict "base" (get $b $k) "user" (get $u $k) "path" $p) }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "gpu-tracer.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end -}}
{{- end -}}

{{/* A TOML value: numbers that are whole are written as integers (a values file reads every
number as a float), strings as JSON strings (also valid TOML), lists and inline tables. */}}
{{- define "gpu-tracer.tomlValue" -}}
{{- if kindIs "string" . }}{{ toJson . }}
{{- else if kindIs "bool" . }}{{ . }}
{{- else if kindIs "float64" . }}{{ if eq (floor .) . }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if or (kindIs "int" .) (kindIs "int64" .) }}{{ . }}
{{- else if kindIs "slice" . }}[{{ range $i, $e := . }}{{ if $i }}, {{ end }}{{ include "gpu-tracer.tomlValue" $e }}{{ end }}]
{{- else if kindIs "map" . }}{ {{- range $i, $k := keys . | sortAlpha }}{{ if $i }},{{ end }} {{ include "gpu-tracer.tomlKey" $k }} = {{ include "gpu-tracer.tomlValue" (get $ $k) }}{{ end }} }
{{- else }}{{ fail (printf "config: %v (%s) cannot be written in TOML" . (kindOf .)) }}
{{- end }}
{{- end -}}

{{/* The namespace of every namespaced object: namespaceOverride, else the release's. */}}
{{- define "gpu-tracer.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The image: repository@digest when a digest is given (the tag is then only a label), else
repository:tag. */}}
{{- define "gpu-tracer.image" -}}
{{- with .Values.image -}}
{{- if .digest -}}
{{ .repository }}@{{ .digest }}
{{- else -}}
{{ .repository }}:{{ .tag | default $.Chart.AppVersion }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The container's securityContext: least privilege (docs/security.md), or `privileged`, with
the keys of the `securityContext` value written over it (each replaces the chart's key whole). */}}
{{- define "gpu-tracer.securityContext" -}}
{{- $sc := dict -}}
{{- if .Values.privileged -}}
{{- /* Opt-in fallback: every capability and device. */ -}}
{{- $sc = dict "privileged" true "allowPrivilegeEscalation" true "seccompProfile" (dict "type" "Unconfined") -}}
{{- else -}}
{{- $sc = dict "privileged" false "allowPrivilegeEscalation" false "seccompProfile" .Values.seccompProfile
      "capabilities" (dict "drop" (list "ALL") "add" (include "gpu-tracer.capabilities" . | fromJsonArray)) -}}
{{- end -}}
{{- /* uid 0, capabilities dropped to the list (docs/security.md). */ -}}
{{- $_ := set $sc "readOnlyRootFilesystem" true -}}
{{- $_ = set $sc "runAsUser" 0 -}}
{{- $_ = set $sc "runAsGroup" 0 -}}
{{- $_ = set $sc "runAsNonRoot" false -}}
{{- $_ = set $sc "appArmorProfile" .Values.appArmorProfile -}}
{{- range $k, $v := .Values.securityContext -}}
{{- $_ = set $sc $k $v -}}
{{- end -}}
{{- toYaml $sc -}}
{{- end -}}

{{/* The pod's affinity: the `affinity` value when it is set; else, unless a nodeSelector chooses
the nodes, GPU nodes (GPU Feature Discovery's label, or Node Feature Discovery's NVIDIA PCI
device); `affinity: null` leaves the pod without any (every node). */}}
{{- define "gpu-tracer.affinity" -}}
{{- if hasKey .Values "affinity" -}}
{{- if .Values.affinity -}}
{{- toYaml .Values.affinity -}}
{{- else if not .Values.nodeSelector -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      - matchExpressions:
          - key: nvidia.com/gpu.present
            operator: In
            values: ["true"]
      - matchExpressions:
          - key: feature.node.kubernetes.io/pci-10de.present
            operator: In
            values: ["true"]
{{- end -}}
{{- end -}}
{{- end -}}
