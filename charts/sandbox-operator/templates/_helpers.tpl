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

{{/* The namespaces the operator watches, comma-separated: watchNamespaces plus watchNamespace,
without repeats, in that order. Empty means every namespace. */}}
{{- define "sandbox-operator.watchNamespaces" -}}
{{- $all := list }}
{{- range .Values.watchNamespaces }}{{ $all = append $all . }}{{ end }}
{{- with .Values.watchNamespace }}{{ $all = append $all . }}{{ end }}
{{- $all | uniq | join "," }}
{{- end }}

{{/* Name of the Secret holding the agent key (made by the operator when absent). */}}
{{- define "sandbox-operator.agentKeySecret" -}}
{{- printf "%s-agent-key" (include "sandbox-operator.fullname" .) }}
{{- end }}

{{/* The operator's ServiceAccount as the API server names it in request.userInfo.username. */}}
{{- define "sandbox-operator.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "sandbox-operator.serviceAccountName" .) }}
{{- end }}

{{/* Labels of the pre-delete hook's Pod: the release and the component, never the Deployment's
selector labels (app.kubernetes.io/name and instance together), so the Deployment, its Service
and the workspace NetworkPolicies never count the hook's Pod as an operator Pod. */}}
{{- define "sandbox-operator.hookPodLabels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: sandbox-operator
app.kubernetes.io/component: uninstall-hook
{{- end }}

{{/* The rules of the operator's role, the same whether bound cluster-wide (ClusterRole) or in
each watched namespace (Role). docs/operations.md, "Privileges", lists every one and why. */}}
{{- define "sandbox-operator.rules" -}}
# Reconcile the custom resources; delete Sandboxes for ttlSecondsAfterFinished and
# PlanCommit cleanupPolicy Delete; kopf keeps its progress in annotations (patch).
- apiGroups: ["sandbox.cleveragents.io"]
  resources: ["sandboxes", "checkpoints", "plancommits"]
  verbs: ["get", "list", "watch", "patch", "update", "delete"]
- apiGroups: ["sandbox.cleveragents.io"]
  resources: ["sandboxes/status", "checkpoints/status", "plancommits/status"]
  verbs: ["get", "patch", "update"]
# Owner references with blockOwnerDeletion on child objects need update on finalizers.
- apiGroups: ["sandbox.cleveragents.io"]
  resources: ["sandboxes/finalizers", "checkpoints/finalizers", "plancommits/finalizers"]
  verbs: ["update"]
# Workspace pods (pod executor): created per Sandbox and watched (their readiness wakes the
# Sandbox). The operator talks to each Pod's workspace agent over the pod network: there is
# no pods/exec right. The admission policy (operator-policy.yaml) refuses any Pod of another
# shape.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# Scratch volumes of worktree/copy/overlay sandboxes; source claims are read for their spec.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "delete"]
# The per-Sandbox agent token Secret: created, its token renewed before it expires (patch; the
# admission policy allows no other update), never read back, never deleted (it is owned by its
# Sandbox and garbage-collected with it). A transaction_rollback DSN reaches the workspace Pod
# through secretKeyRef: the kubelet reads it, the operator does not.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: [{{ if eq .Values.executor "pod" }}"create", "patch"{{ else }}"create"{{ end }}]
{{- if eq .Values.executor "local" }}
# The local executor connects to the database itself, so it reads spec.source.secretRef.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
{{- if .Values.workspace.networkPolicy.enabled }}
# One NetworkPolicy per workspace Pod: ingress only from the operator, egress denied by default.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "delete"]
{{- end }}
# kopf posts Kubernetes Events for handler outcomes and failures.
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: [{{ if eq .Values.executor "pod" }}"create", "patch"{{ else }}"create"{{ end }}]
{{- end }}

{{/* The Localhost seccomp profile of workspace Pods (relative to the kubelet's seccomp
directory), or "" for RuntimeDefault. */}}
{{- define "sandbox-operator.workspaceSeccompProfile" -}}
{{- if eq .Values.workspace.seccompProfile.type "Localhost" }}
{{- required "workspace.seccompProfile.localhostProfile is required with type Localhost" .Values.workspace.seccompProfile.localhostProfile }}
{{- end }}
{{- end }}
