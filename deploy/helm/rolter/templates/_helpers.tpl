{{- define "rolter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rolter.fullname" -}}
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

{{- define "rolter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rolter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rolter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "rolter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The Secret holding the superadmin token, and its key. */}}
{{- define "rolter.adminSecret" -}}
{{- default (printf "%s-admin" (include "rolter.fullname" .)) .Values.control.existingSecret }}
{{- end }}
{{- define "rolter.adminSecretKey" -}}
{{- if .Values.control.existingSecret }}{{ .Values.control.existingSecretKey }}{{ else }}admin-token{{ end }}
{{- end }}

{{/* The store: the PostgreSQL URL, or a SQLite file in the data volume. */}}
{{- define "rolter.store" -}}
{{- default "/var/lib/rolter/rolter.db" .Values.control.store }}
{{- end }}
{{- define "rolter.postgres" -}}
{{- if or (hasPrefix "postgres://" .Values.control.store) (hasPrefix "postgresql://" .Values.control.store) }}true{{ end }}
{{- end }}

{{/* More than one gateway must share a PostgreSQL store: separate SQLite files would drift apart. */}}
{{- define "rolter.check" -}}
{{- include "rolter.checkToml" . }}
{{- if and .Values.control.enabled (not (include "rolter.postgres" .)) }}
{{- if or (gt (int .Values.replicaCount) 1) .Values.autoscaling.enabled }}
{{- fail "replicaCount > 1 or autoscaling needs control.store = \"postgres://...\": gateways with their own SQLite files would drift apart" }}
{{- end }}
{{- end }}
{{- if and .Values.control.store (not (include "rolter.postgres" .)) }}
{{- fail "control.store must be a postgres:// or postgresql:// URL, or empty (a SQLite file in the pod)" }}
{{- end }}
{{- if and (include "rolter.postgres" .) (regexMatch "://[^/@]*:[^/@]*@" .Values.control.store) }}
{{- fail "control.store must not hold the password: put it in a Secret named by control.database.passwordSecret" }}
{{- end }}
{{- if and .Values.control.tls.clientCA (not .Values.control.tls.secretName) }}
{{- fail "control.tls.clientCA needs control.tls.secretName: the CAs come from that Secret's ca.crt" }}
{{- end }}
{{- end }}

{{/* rolter.toml as the ConfigMap holds it: [server] and [control] from the values, then config. */}}
{{- define "rolter.toml" -}}
# Written by the rolter Helm chart: [server] and [control] come from values.yaml, the rest is config.
[server]
listen = ":{{ .Values.server.port }}"
drain_secs = {{ .Values.server.drainSecs }}
{{- range $k, $v := .Values.server.settings }}
{{ $k }} = {{ toJson $v }}
{{- end }}
{{- if .Values.server.tls.secretName }}
tls_cert_file = "/etc/rolter-tls/server/tls.crt"
tls_key_file = "/etc/rolter-tls/server/tls.key"
{{- end }}

[control]
enabled = {{ .Values.control.enabled }}
listen = ":{{ .Values.control.port }}"
store = {{ include "rolter.store" . | toJson }}
admin_token_env = "ROLTER_ADMIN_TOKEN"
{{- if .Values.control.tls.secretName }}
tls_cert_file = "/etc/rolter-tls/control/tls.crt"
tls_key_file = "/etc/rolter-tls/control/tls.key"
{{- if .Values.control.tls.clientCA }}
tls_client_ca_file = "/etc/rolter-tls/control/ca.crt"
{{- end }}
{{- end }}
{{- range (include "rolter.sources" . | fromJsonArray) }}

[[sources]]
{{- include "rolter.tomlTable" (list "sources" .) }}
{{- end }}
{{ with .Values.config }}
{{ . }}
{{- end }}
{{- end }}

{{/* discovery.sources as JSON, with their defaults: kind "kubernetes", in the release's namespace. */}}
{{- define "rolter.sources" -}}
{{- $out := list }}
{{- range .Values.discovery.sources }}
{{- $s := deepCopy . }}
{{- if not (hasKey $s "kind") }}{{ $_ := set $s "kind" "kubernetes" }}{{ end }}
{{- if eq $s.kind "kubernetes" }}
{{- $k := default dict $s.kubernetes }}
{{- if not $k.namespace }}{{ $_ := set $k "namespace" $.Release.Namespace }}{{ end }}
{{- $_ := set $s "kubernetes" $k }}
{{- end }}
{{- $out = append $out $s }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* The namespaces the kubernetes sources read, as JSON. */}}
{{- define "rolter.sourceNamespaces" -}}
{{- $ns := list }}
{{- range (include "rolter.sources" . | fromJsonArray) }}
{{- if eq .kind "kubernetes" }}{{ $ns = append $ns .kubernetes.namespace }}{{ end }}
{{- end }}
{{- toJson (uniq $ns) }}
{{- end }}

{{/* One TOML table's keys from a map (list path map): scalars and arrays as JSON, which TOML reads the
same, then each map value as the sub-table [path.key]. */}}
{{- define "rolter.tomlTable" -}}
{{- $path := index . 0 }}
{{- $m := index . 1 }}
{{- range $k, $v := $m }}
{{- if not (kindIs "map" $v) }}
{{ $k }} = {{ toJson $v }}
{{- end }}
{{- end }}
{{- range $k, $v := $m }}
{{- if kindIs "map" $v }}
[{{ $path }}.{{ $k }}]
{{- include "rolter.tomlTable" (list (printf "%s.%s" $path $k) $v) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rolter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rolter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* A rolter.toml that is not TOML (a typo in config, or a [server] or [control] table of its own, which
the chart writes) fails the render instead of a pod that cannot start. */}}
{{- define "rolter.checkToml" -}}
{{- $parsed := fromToml (include "rolter.toml" .) }}
{{- if hasKey $parsed "Error" }}
{{- fail (printf "rolter.toml is not valid TOML (check config; [server] and [control] come from values): %s" (get $parsed "Error")) }}
{{- end }}
{{- end }}

{{- define "rolter.gracePeriod" -}}
{{- add (int (ceil .Values.server.drainSecs)) (int .Values.preStopSleepSecs) (int .Values.terminationMarginSecs) }}
{{- end }}
