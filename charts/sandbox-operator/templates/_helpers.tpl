{{/* Chart name, shortened to the 63 characters a label value may hold. */}}
{{- define "sandbox-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects: <release>-<chart> unless the release already says it. */}}
{{- define "sandbox-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sandbox-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Recommended app.kubernetes.io/* labels, on every object of the chart. */}}
{{- define "sandbox-operator.labels" -}}
helm.sh/chart: {{ include "sandbox-operator.chart" . }}
{{ include "sandbox-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: sandbox-operator
{{- end }}

{{/* The subset of labels that never changes across upgrades (Deployment selector). */}}
{{- define "sandbox-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sandbox-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sandbox-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sandbox-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repo@digest when image.digest is set (a digest names one build), else repo:tag. */}}
{{- define "sandbox-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Workspace pods use the same image unless told otherwise (one image, two entrypoints);
with image.digest and no workspace override they use the same digest. */}}
{{- define "sandbox-operator.workspaceImage" -}}
{{- $repo := default .Values.image.repository .Values.workspace.image.repository }}
{{- if and .Values.image.digest (not .Values.workspace.image.repository) (not .Values.workspace.image.tag) }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.workspace.image.tag }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}
{{- end }}

{{/* workspace.* as a Sandbox spec.workspace block (JSON): the defaults every Sandbox inherits. */}}
{{- define "sandbox-operator.workspaceDefaults" -}}
{{- $w := .Values.workspace }}
{{- $out := dict }}
{{- with $w.resources }}{{ $_ := set $out "resources" . }}{{ end }}
{{- with $w.nodeSelector }}{{ $_ := set $out "nodeSelector" . }}{{ end }}
{{- with $w.tolerations }}{{ $_ := set $out "tolerations" . }}{{ end }}
{{- with $w.affinity }}{{ $_ := set $out "affinity" . }}{{ end }}
{{- with $w.runtimeClassName }}{{ $_ := set $out "runtimeClassName" . }}{{ end }}
{{- with $w.priorityClassName }}{{ $_ := set $out "priorityClassName" . }}{{ end }}
{{- with $w.imagePullSecrets }}{{ $_ := set $out "imagePullSecrets" . }}{{ end }}
{{- with $w.egress }}{{ $_ := set $out "egress" . }}{{ end }}
{{- $scratch := dict "size" $w.scratchVolumeSize }}
{{- with $w.scratchStorageClassName }}{{ $_ := set $scratch "storageClassName" . }}{{ end }}
{{- $_ := set $out "scratch" $scratch }}
{{- toJson $out }}
{{- end }}
