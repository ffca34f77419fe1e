{{/*
The chart name, or nameOverride.
*/}}
{{- define "purgatory.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name: fullnameOverride, or the release name followed by the chart name (the release
name alone when it already contains the chart name). DNS labels are at most 63 characters.
*/}}
{{- define "purgatory.fullname" -}}
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

{{/*
chart-version, as the helm.sh/chart label.
*/}}
{{- define "purgatory.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every resource.
*/}}
{{- define "purgatory.labels" -}}
helm.sh/chart: {{ include "purgatory.chart" . }}
{{ include "purgatory.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: purgatory
{{- end }}

{{/*
Labels that select the release's pods (never change them: selectors are immutable).
*/}}
{{- define "purgatory.selectorLabels" -}}
app.kubernetes.io/name: {{ include "purgatory.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The ServiceAccount's name.
*/}}
{{- define "purgatory.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "purgatory.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image reference: repository, then @digest or :tag (the appVersion by default).
*/}}
{{- define "purgatory.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Whether the pods run as a StatefulSet that assigns partitions by pod ordinal.
*/}}
{{- define "purgatory.ordinal" -}}
{{- if eq .Values.partitionAssignment.mode "ordinal" }}true{{ end }}
{{- end }}

{{/*
A setting's value as the text of its environment variable. Helm reads numbers from values as
floating point, so integers are printed as integers (never 1e+07).
*/}}
{{- define "purgatory.settingText" -}}
{{- if kindIs "bool" . }}
{{- ternary "true" "false" . }}
{{- else if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) }}
{{- . | int64 | toString }}
{{- else }}
{{- . | toString }}
{{- end }}
{{- end }}

{{/*
Where the mounted secrets and files live in the container.
*/}}
{{- define "purgatory.saslDir" -}}/var/run/secrets/purgatory/kafka-sasl{{- end }}
{{- define "purgatory.tlsDir" -}}/var/run/secrets/purgatory/kafka-tls{{- end }}
{{- /* The Secret holding the API token: the existing one, the generated one, or none. */}}
{{- define "purgatory.apiTokenSecret" -}}
{{- if .Values.apiToken.existingSecret }}{{ .Values.apiToken.existingSecret }}
{{- else if .Values.apiToken.generate }}{{ include "purgatory.fullname" . }}-api-token
{{- end }}
{{- end }}

{{- define "purgatory.apiTokenDir" -}}/var/run/secrets/purgatory/api-token{{- end }}
{{- define "purgatory.partitionsDir" -}}/etc/purgatory/partitions{{- end }}

{{/*
Fails on combinations the schema cannot express, naming the values involved.
*/}}
{{- define "purgatory.validate" -}}
{{- $cfg := .Values.config }}
{{- $protocol := $cfg.kafka_security_protocol }}
{{- $sasl := .Values.kafka.sasl }}
{{- if and (hasPrefix "SASL_" $protocol) (not $sasl.existingSecret) }}
{{- fail (printf "kafka.sasl.existingSecret: required when config.kafka_security_protocol is %s (the password is read from that Secret, never from values)" $protocol) }}
{{- end }}
{{- if and $sasl.existingSecret (not (hasPrefix "SASL_" $protocol)) }}
{{- fail (printf "kafka.sasl.existingSecret: only used with config.kafka_security_protocol SASL_PLAINTEXT or SASL_SSL, got %s" $protocol) }}
{{- end }}
{{- if and $sasl.existingSecret $sasl.usernameKey $cfg.kafka_sasl_username }}
{{- fail "config.kafka_sasl_username: set either it or kafka.sasl.usernameKey, not both" }}
{{- end }}
{{- /* The service's own cross-checks, so that they fail the install rather than every pod. */}}
{{- if and (hasPrefix "SASL_" $protocol) (not $cfg.kafka_sasl_mechanism) }}
{{- fail (printf "config.kafka_sasl_mechanism: required when config.kafka_security_protocol is %s" $protocol) }}
{{- end }}
{{- if and $cfg.kafka_sasl_mechanism (not (hasPrefix "SASL_" $protocol)) }}
{{- fail (printf "config.kafka_sasl_mechanism: only used with config.kafka_security_protocol SASL_PLAINTEXT or SASL_SSL, got %s" $protocol) }}
{{- end }}
{{- if and $sasl.existingSecret (not $sasl.usernameKey) (not $cfg.kafka_sasl_username) }}
{{- fail "kafka.sasl.usernameKey: required (or config.kafka_sasl_username) with kafka.sasl.existingSecret" }}
{{- end }}
{{- $topics := dict }}
{{- range $name := list "topic_requests" "topic_signals" "topic_callbacks" "topic_dead_letters" "topic_changelog" "topic_snapshots" }}
{{- $topic := get $cfg $name }}
{{- if hasKey $topics $topic }}
{{- fail (printf "config.%s: must differ from config.%s, both are %q" $name (get $topics $topic) $topic) }}
{{- end }}
{{- $_ := set $topics $topic $name }}
{{- end }}
{{- if gt (int64 $cfg.max_pending_per_scope) (int64 $cfg.max_pending) }}
{{- fail (printf "config.max_pending_per_scope: must not exceed config.max_pending (%d), got %d" (int64 $cfg.max_pending) (int64 $cfg.max_pending_per_scope)) }}
{{- end }}
{{- if ge (int64 $cfg.max_payload_bytes) (int64 $cfg.max_record_bytes) }}
{{- fail (printf "config.max_payload_bytes: must be less than config.max_record_bytes (%d), got %d" (int64 $cfg.max_record_bytes) (int64 $cfg.max_payload_bytes)) }}
{{- end }}
{{- if ge (int64 $cfg.max_signal_bytes_per_operation) (int64 $cfg.max_record_bytes) }}
{{- fail (printf "config.max_signal_bytes_per_operation: must be less than config.max_record_bytes (%d), got %d" (int64 $cfg.max_record_bytes) (int64 $cfg.max_signal_bytes_per_operation)) }}
{{- end }}
{{- if and .Values.kafka.tls.existingSecret (not (has $protocol (list "SSL" "SASL_SSL"))) }}
{{- fail (printf "kafka.tls.existingSecret: only used with config.kafka_security_protocol SSL or SASL_SSL, got %s" $protocol) }}
{{- end }}
{{- if and .Values.kafka.tls.keyKey (not .Values.kafka.tls.certKey) }}
{{- fail "kafka.tls.keyKey: needs kafka.tls.certKey as well" }}
{{- end }}
{{- if and .Values.kafka.tls.certKey (not .Values.kafka.tls.keyKey) }}
{{- fail "kafka.tls.certKey: needs kafka.tls.keyKey as well" }}
{{- end }}
{{- if include "purgatory.ordinal" . }}
{{- if gt (int .Values.replicaCount) (int .Values.partitionAssignment.partitions) }}
{{- fail (printf "replicaCount: at most partitionAssignment.partitions (%d) in ordinal mode, got %d" (int .Values.partitionAssignment.partitions) (int .Values.replicaCount)) }}
{{- end }}
{{- end }}
{{- with .Values.networkPolicy }}
{{- if and .enabled .egress.enabled }}
{{- $open := list }}
{{- range .egress.kafkaPorts }}{{ $open = append $open (int .) }}{{ end }}
{{- range splitList "," $cfg.kafka_bootstrap_servers }}
{{- $port := int (regexReplaceAll "^.*:" (trim .) "") }}
{{- if not (has $port $open) }}
{{- fail (printf "networkPolicy.egress.kafkaPorts: must include %d, the port of %s in config.kafka_bootstrap_servers, got %v" $port (trim .) $open) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if eq (int .Values.service.port) (int .Values.service.metricsPort) }}
{{- fail (printf "service.metricsPort: must differ from service.port (%d): a Service cannot list a port twice" (int .Values.service.port)) }}
{{- end }}
{{- /* The grace period counts from the pre-stop hook: the pause, then (group mode) the
hand-over to warm next owners, then the service's own stop, then (with snapshots on) the
snapshotter's last snapshots, which serve ends after 10 s. */}}
{{- $preStopSeconds := int64 .Values.lifecycle.preStopSleepSeconds }}
{{- $handOverMs := 0 }}
{{- if eq .Values.partitionAssignment.mode "group" }}
{{- $handOverMs = int64 $cfg.hand_over_ms }}
{{- end }}
{{- $graceMs := int64 $cfg.shutdown_grace_ms }}
{{- $lastSnapshotsMs := 0 }}
{{- if and $cfg.journal (gt (int64 $cfg.snapshot_interval_ms) 0) }}
{{- $lastSnapshotsMs = 10000 }}
{{- end }}
{{- if ge (add (mul $preStopSeconds 1000) $handOverMs $graceMs $lastSnapshotsMs) (mul (int64 .Values.terminationGracePeriodSeconds) 1000) }}
{{- fail (printf "lifecycle.preStopSleepSeconds + config.hand_over_ms (group mode) + config.shutdown_grace_ms (+ 10 s for the last snapshots with config.journal and config.snapshot_interval_ms on): must stay below terminationGracePeriodSeconds (%ds), got %ds + %d ms + %d ms + %d ms" (int64 .Values.terminationGracePeriodSeconds) $preStopSeconds $handOverMs $graceMs $lastSnapshotsMs) }}
{{- end }}
{{- end }}

{{/*
"true" when the PodDisruptionBudget lets no pod be evicted (Kubernetes rounds percentages up):
a node drain then waits until someone deletes the pod by hand.
*/}}
{{- define "purgatory.pdbBlocksEvictions" -}}
{{- $replicas := int .Values.replicaCount }}
{{- with .Values.podDisruptionBudget }}
{{- if and .enabled (gt $replicas 0) }}
{{- $bound := ternary .maxUnavailable .minAvailable (kindIs "invalid" .minAvailable) }}
{{- $pods := 0 }}
{{- if kindIs "string" $bound }}
{{- $pods = div (add (mul (int (trimSuffix "%" $bound)) $replicas) 99) 100 }}
{{- else }}
{{- $pods = int $bound }}
{{- end }}
{{- if kindIs "invalid" .minAvailable }}
{{- if le $pods 0 }}true{{ end }}
{{- else if ge $pods $replicas }}true{{ end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The container's memory limit in bytes; empty without one. Only whole quantities are read: plain
bytes, or an integer with a binary (Ki Mi Gi Ti) or decimal (k M G T) suffix; anything else
fails, naming resources.limits.memory, rather than giving an alert a wrong threshold.
*/}}
{{- define "purgatory.memoryLimitBytes" -}}
{{- $limits := .Values.resources.limits }}
{{- if hasKey $limits "memory" }}
{{- $limit := $limits.memory }}
{{- $text := "" }}
{{- if kindIs "string" $limit }}
{{- $text = $limit }}
{{- else if and (or (kindIs "float64" $limit) (kindIs "int" $limit) (kindIs "int64" $limit)) (eq (float64 $limit) (floor $limit)) }}
{{- $text = include "purgatory.settingText" $limit }}
{{- end }}
{{- $units := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 }}
{{- $digits := regexFind "^[0-9]{1,18}" $text }}
{{- $suffix := trimPrefix $digits $text }}
{{- $bytes := 0 }}
{{- if and $digits (hasKey $units $suffix) }}
{{- /* atoi reads base 10 (int64 would read 010 as octal); 18 digits cannot overflow it. */}}
{{- $count := atoi $digits }}
{{- $bytes = mul $count (get $units $suffix) }}
{{- /* int64 multiplication wraps silently: dividing back tells an overflow. */}}
{{- if ne (div $bytes (get $units $suffix)) (int64 $count) }}{{ $bytes = 0 }}{{ end }}
{{- end }}
{{- if le (int64 $bytes) 0 }}
{{- fail (printf "resources.limits.memory: the PurgatoryMemoryNearLimit alert needs a positive whole number of bytes, optionally with a Ki, Mi, Gi, Ti, k, M, G or T suffix, got %v" $limit) }}
{{- end }}
{{- printf "%d" (int64 $bytes) }}
{{- end }}
{{- end }}

{{/*
Series selector of the alerts: prometheusRule.selector, or the Service's job and namespace.
*/}}
{{- define "purgatory.metricSelector" -}}
{{- if .Values.prometheusRule.selector }}
{{- .Values.prometheusRule.selector }}
{{- else }}
{{- printf "job=%q,namespace=%q" (include "purgatory.fullname" .) .Release.Namespace }}
{{- end }}
{{- end }}
