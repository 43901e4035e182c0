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
  {{- with .relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end -}}
