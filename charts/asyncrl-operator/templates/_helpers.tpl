{{/* Names, labels and the RBAC rules shared by the templates. */}}

{{- define "asyncrl-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "asyncrl-operator.fullname" -}}
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

{{/* Cluster-scoped objects are shared by every release: the namespace keeps two releases apart. */}}
{{- define "asyncrl-operator.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "asyncrl-operator.fullname" .) }}
{{- end }}

{{- define "asyncrl-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "asyncrl-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "asyncrl-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "asyncrl-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "asyncrl-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "asyncrl-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The namespaces whose runs the operator reconciles when not cluster-wide. */}}
{{- define "asyncrl-operator.watchNamespaces" -}}
{{- if .Values.watch.namespaces }}
{{- join "," (uniq .Values.watch.namespaces) }}
{{- else }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{- define "asyncrl-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The operator's rules in each watched namespace: the same as operator/rbac/role.yaml, which explains each
one (tests/charts checks that they stay identical).
*/}}
{{- define "asyncrl-operator.rules" -}}
- apiGroups: ["asyncrl.dev"]
  resources: ["asynctrainingruns"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["asyncrl.dev"]
  resources: ["asynctrainingruns/status"]
  verbs: ["patch"]
- apiGroups: ["asyncrl.dev"]
  resources: ["asynctrainingruns/finalizers"]
  verbs: ["update"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create", "get", "list", "watch", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["create", "get", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "get"]
- apiGroups: [""]
  resources: ["configmaps", "services"]
  verbs: ["create", "get", "list", "watch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.kuberay.enabled }}
{{- /* Multi-node runs (spec.trainer.nodes > 1): the rules of operator/rbac/kuberay.yaml. */}}
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["create", "get", "patch"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
{{- end }}
{{- end }}

{{/* Cluster-scoped reads kopf makes in either mode: it watches CRDs to notice ours changing. */}}
{{- define "asyncrl-operator.crdRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end }}

{{/* The leader election's Lease: the rules of operator/rbac/leader-election.yaml (tests/charts compares). */}}
{{- define "asyncrl-operator.leaseRules" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "create", "update"]
{{- end }}
