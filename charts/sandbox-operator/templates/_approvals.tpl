{{- /*
Named approvals (docs/approvals.md): the helpers the approval policy and the operator's
environment share, so the policy and the operator judge an approval by the same lists.
*/ -}}

{{- /* The operator's own user name: it never approves what it commits. */ -}}
{{- define "sandbox-operator.approvals.operatorUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "sandbox-operator.serviceAccountName" . }}
{{- end }}

{{- /* User names that may never approve: the operator and approvals.forbiddenApprovers. */ -}}
{{- define "sandbox-operator.approvals.forbiddenUsers" -}}
{{- $users := list (include "sandbox-operator.approvals.operatorUser" .) }}
{{- range .Values.approvals.forbiddenApprovers }}
{{- $users = append $users (toString .) }}
{{- end }}
{{- $users | uniq | toJson }}
{{- end }}

{{- /* Whether the approval policy is rendered: "true", "false", or "auto" (when the cluster
serves ValidatingAdmissionPolicy v1, Kubernetes 1.30 and later). */ -}}
{{- define "sandbox-operator.approvals.policyEnabled" -}}
{{- $mode := toString .Values.approvals.policy.enabled }}
{{- $served := .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" }}
{{- if or (eq $mode "true") (and (eq $mode "auto") $served) }}true{{ end }}
{{- end }}

{{- /* The operator's environment for the approval policy (one include in the Deployment). */ -}}
{{- define "sandbox-operator.approvals.env" -}}
- name: SANDBOX_OPERATOR_APPROVAL_REQUIRED
  value: {{ .Values.approvals.required | toString | quote }}
- name: SANDBOX_OPERATOR_MIN_APPROVALS
  value: {{ .Values.approvals.minApprovals | toString | quote }}
- name: SANDBOX_OPERATOR_FORBIDDEN_APPROVERS
  value: {{ include "sandbox-operator.approvals.forbiddenUsers" . | fromJsonArray | join "," | quote }}
- name: SANDBOX_OPERATOR_FORBIDDEN_APPROVER_GROUPS
  value: {{ .Values.approvals.forbiddenGroups | join "," | quote }}
- name: SANDBOX_OPERATOR_APPROVER_GROUPS
  value: {{ .Values.approvals.approverGroups | join "," | quote }}
{{- end }}
