{{/* The chart's short name: nameOverride or the chart name, cut to a DNS label. */}}
{{- define "oomguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release-qualified name every object is named after (63 characters at most). */}}
{{- define "oomguard.fullname" -}}
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

{{- define "oomguard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that never change for a release: Deployment selectors use them, so they must stay stable. */}}
{{- define "oomguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "oomguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every object's labels. */}}
{{- define "oomguard.labels" -}}
helm.sh/chart: {{ include "oomguard.chart" . }}
{{ include "oomguard.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* <fullname>-<suffix>, the fullname cut so the whole stays a 63-character DNS label. Call with (list . "suffix"). */}}
{{- define "oomguard.suffixed" -}}
{{- $suffix := index . 1 }}
{{- printf "%s-%s" (include "oomguard.fullname" (index . 0) | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

{{- define "oomguard.schedulerName" -}}
{{- include "oomguard.suffixed" (list . "scheduler") }}
{{- end }}

{{- define "oomguard.workerName" -}}
{{- include "oomguard.suffixed" (list . "worker") }}
{{- end }}

{{- define "oomguard.storeClaimName" -}}
{{- default (include "oomguard.suffixed" (list . "store")) .Values.store.persistence.existingClaim }}
{{- end }}

{{/* The scheduler's address as workers and clients inside the cluster see it. */}}
{{- define "oomguard.schedulerAddress" -}}
{{- printf "tcp://%s:%v" (include "oomguard.schedulerName" .) .Values.scheduler.port }}
{{- end }}

{{/* Whether the scheduler gets a ServiceAccount, Role and RoleBinding: rbac.create, or follow kubernetesLookup.enabled when it is null. */}}
{{- define "oomguard.rbacEnabled" -}}
{{- if kindIs "bool" .Values.rbac.create }}{{ .Values.rbac.create }}{{ else }}{{ .Values.kubernetesLookup.enabled }}{{ end }}
{{- end }}

{{- define "oomguard.serviceAccountName" -}}
{{- if eq (include "oomguard.rbacEnabled" .) "true" }}
{{- default (include "oomguard.schedulerName" .) .Values.rbac.serviceAccountName }}
{{- else }}
{{- default "default" .Values.rbac.serviceAccountName }}
{{- end }}
{{- end }}

{{/* The image reference, tag defaulting to the chart's pinned Dask release. */}}
{{- define "oomguard.image" -}}
{{- printf "%s:%s" .Values.image.repository (toString .Values.image.tag) }}
{{- end }}

{{/*
A Kubernetes memory quantity ("4Gi", "512Mi", "4G", "4000000000") in bytes.
Only whole numbers: values.schema.json enforces the same pattern.
*/}}
{{- define "oomguard.quantityBytes" -}}
{{- $q := toString . }}
{{- $n := regexFind "^[0-9]+" $q | int64 }}
{{- $suffix := trimPrefix (regexFind "^[0-9]+" $q) $q }}
{{- $factors := dict "" 1 "k" 1000 "K" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 }}
{{- if not (hasKey $factors $suffix) }}
{{- fail (printf "worker.memoryLimit %q: expected a whole number with an optional Ki/Mi/Gi/Ti/K/M/G/T suffix" $q) }}
{{- end }}
{{- mul $n (get $factors $suffix | int64) }}
{{- end }}

{{/*
One env var per leaf of a values map: camelCase or kebab-case keys become Dask's env names,
  oomguard.scheduler.maxShardInfraFailures -> DASK_OOMGUARD__SCHEDULER__MAX_SHARD_INFRA_FAILURES
Null leaves are skipped (Dask keeps its default). Call with (dict "prefix" "DASK_OOMGUARD" "map" $m).
*/}}
{{- define "oomguard.envFromMap" -}}
{{- $prefix := .prefix }}
{{- range $key, $value := .map }}
{{- $name := printf "%s__%s" $prefix ($key | replace "-" "_" | snakecase | upper) }}
{{- if kindIs "map" $value }}
{{- include "oomguard.envFromMap" (dict "prefix" $name "map" $value) }}
{{- else if not (kindIs "invalid" $value) }}
- name: {{ $name }}
  value: {{ include "oomguard.envValue" $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* A value as Dask reads it from the environment: whole numbers without an exponent. */}}
{{- define "oomguard.envValue" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) }}{{ int64 . }}{{ else }}{{ toString . }}{{ end }}
{{- end }}

{{/* The env vars both containers share: the pod's identity and the oomguard config. */}}
{{- define "oomguard.commonEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- include "oomguard.envFromMap" (dict "prefix" "DASK_OOMGUARD" "map" .Values.oomguard) }}
{{- end }}

{{/* Prometheus label matchers for this release's scheduler, used by the alert rules. */}}
{{- define "oomguard.metricSelector" -}}
{{- printf "namespace=%q, pod=~%q" .Release.Namespace (printf "%s-.*" (include "oomguard.schedulerName" .)) }}
{{- end }}
