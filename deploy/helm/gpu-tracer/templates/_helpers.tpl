{{/* The objects' name: the release name. */}}
{{- define "gpu-tracer.fullname" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpu-tracer.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
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
{{- if .Values.cudaProbes }}{{ $caps = append $caps "SYS_ADMIN" }}{{ end -}}
{{- if .Values.memlockCapability }}{{ $caps = append $caps "SYS_RESOURCE" }}{{ end -}}
{{- toJson $caps -}}
{{- end -}}
