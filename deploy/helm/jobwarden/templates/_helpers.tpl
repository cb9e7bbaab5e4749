{{/*
Names, labels, the image and the configuration file, shared by the templates.
*/}}

{{/* The chart's name: app.kubernetes.io/name of every object. */}}
{{- define "jobwarden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' name: the release's name when it holds the chart's (release "jobwarden" gives
the names of k8s/base), else <release>-<chart>. At most 52 characters: the StatefulSet's pods
are <name>-<n> and its revisions' label <name>-<10-character hash> must fit in 63.
*/}}
{{- define "jobwarden.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "jobwarden.configName" -}}
{{ include "jobwarden.fullname" . }}-config
{{- end }}

{{/*
Selector labels of one component ("worker" or "migration"): call with
(dict "ctx" $ "component" "worker"). The release's instance label keeps two releases in one
namespace from selecting each other's pods.
*/}}
{{- define "jobwarden.selectorLabels" -}}
app.kubernetes.io/name: {{ include "jobwarden.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Labels of an object's metadata: the selector labels and Helm's. */}}
{{- define "jobwarden.labels" -}}
{{ include "jobwarden.selectorLabels" . }}
app.kubernetes.io/part-of: jobwarden
{{- with .ctx.Chart.AppVersion }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{- end }}

{{/* jobwarden's image (the sidecar and the migration Job). An empty tag adds none. */}}
{{- define "jobwarden.image" -}}
{{- $image := .Values.image -}}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else if $image.tag }}
{{- printf "%s:%s" $image.repository (toString $image.tag) }}
{{- else }}
{{- $image.repository }}
{{- end }}
{{- end }}

{{/*
The port of config.worker.ops_listen (probes, the preStop drain, metrics): the one place the
port is given. "off" or no port cannot work here: the kubelet's probes need the ops listener.
*/}}
{{- define "jobwarden.opsPort" -}}
{{- $listen := toString (.Values.config.worker.ops_listen | default "") }}
{{- $port := regexFind "[0-9]+$" $listen }}
{{- if or (not $port) (not (regexMatch ":[0-9]+$" $listen)) }}
{{- fail (printf "config.worker.ops_listen must be an address and port such as 0.0.0.0:7434 (the probes and the preStop drain reach the worker there), not %q" $listen) }}
{{- end }}
{{- $port }}
{{- end }}

{{/*
The NATS consumers of every queue, as the worker names them (src/broker.rs, Lane):
"<durable>|<subject>" per line, the bare lane first, then the priority bands 0 to 9.
*/}}
{{- define "jobwarden.lanes" -}}
{{- $prefix := .Values.config.nats.subject_prefix | default "jobs" }}
{{- range $queue, $_ := .Values.queues }}
{{- if $_ }}
{{ printf "jobwarden-%s|%s.%s" $queue $prefix $queue }}
{{- range $band := until 10 }}
{{ printf "jobwarden-%s~p%d|%s.%s.%d" $queue $band $prefix $queue $band }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
jobwarden.toml from .Values.config and .Values.queues. TOML is written here rather than with
Helm's toToml: values read from YAML are float64 in Helm, which toToml writes as 16.0, and
jobwarden's integers refuse that. A table whose entries are all tables becomes section
headers ([queues.email]); in a table with a plain value (a section), a nested table is
written inline (backoff = { ... }) when its line fits in 96 characters (the ConfigMap indents
it by 4, yamllint allows 100), else as a section of its own after the plain values.
*/}}
{{- define "jobwarden.toml" -}}
{{- if .Values.config.queues }}
{{- fail "set the queues under queues, not config.queues" }}
{{- end }}
{{- $config := deepCopy .Values.config }}
{{- $_ := set $config "queues" .Values.queues }}
# jobwarden's configuration, rendered by the Helm chart from its values config and queues
# (deploy/helm/jobwarden/values.yaml); every setting: docs/configuration.md.
{{- include "jobwarden.toml.section" (dict "path" "" "table" $config) }}
{{- end }}

{{/* One table at .path (dotted, keys quoted where needed): see jobwarden.toml. */}}
{{- define "jobwarden.toml.section" -}}
{{- $path := .path }}
{{- $leaf := false }}
{{- range $k, $v := .table }}
{{- if and (not (kindIs "map" $v)) (not (kindIs "invalid" $v)) }}{{ $leaf = true }}{{ end }}
{{- end }}
{{- $sections := list }}
{{- if or $leaf (and $path (empty .table)) }}

[{{ $path }}]
{{- range $k, $v := .table }}
{{- if not (kindIs "invalid" $v) }}
{{- $line := printf "%s = %s" (include "jobwarden.toml.key" $k) (include "jobwarden.toml.value" $v) }}
{{- if or (not (kindIs "map" $v)) (le (len $line) 96) }}
{{ $line }}
{{- else }}
{{- $sections = append $sections $k }}
{{- end }}
{{- end }}
{{- end }}
{{- else }}
{{- range $k, $v := .table }}
{{- if kindIs "map" $v }}{{ $sections = append $sections $k }}{{ end }}
{{- end }}
{{- end }}
{{- range $k := $sections }}
{{- $sub := include "jobwarden.toml.key" $k }}
{{- $subPath := ternary $sub (printf "%s.%s" $path $sub) (empty $path) }}
{{- include "jobwarden.toml.section" (dict "path" $subPath "table" (index $.table $k)) }}
{{- end }}
{{- end }}

{{- define "jobwarden.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{- define "jobwarden.toml.value" -}}
{{- if kindIs "string" . }}{{ toJson . }}
{{- else if kindIs "bool" . }}{{ . }}
{{- else if kindIs "map" . }}
{{- $items := list }}
{{- range $k, $v := . }}
{{- if not (kindIs "invalid" $v) }}
{{- $items = append $items (printf "%s = %s" (include "jobwarden.toml.key" $k) (include "jobwarden.toml.value" $v)) }}
{{- end }}
{{- end }}
{{- if $items }}{ {{ join ", " $items }} }{{ else }}{}{{ end }}
{{- else if kindIs "slice" . }}
{{- $items := list }}
{{- range . }}{{ $items = append $items (include "jobwarden.toml.value" .) }}{{ end }}
{{- printf "[%s]" (join ", " $items) }}
{{- else if or (kindIs "float64" .) (kindIs "float32" .) }}
{{- if eq (floor .) (float64 .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if kindIs "invalid" . }}
{{- fail "a null value inside a TOML array" }}
{{- else }}{{ . }}
{{- end }}
{{- end }}
