{{/*
The restricted pod security profile of every container (Pod Security Standards "restricted").
*/}}
{{- define "purgatory.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
The pod template shared by the Deployment and the StatefulSet.
*/}}
{{- define "purgatory.podTemplate" -}}
metadata:
  labels:
    {{- include "purgatory.selectorLabels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
    {{- if include "purgatory.ordinal" . }}
    checksum/partitions: {{ include (print $.Template.BasePath "/partitions-configmap.yaml") . | sha256sum }}
    {{- end }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "purgatory.serviceAccountName" . }}
  automountServiceAccountToken: false
  {{- /* Service links would inject PURGATORY_* variables that the service rejects as unknown. */}}
  enableServiceLinks: false
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ int .Values.terminationGracePeriodSeconds }}
  securityContext:
    runAsNonRoot: true
    {{- with .Values.securityContext }}
    {{- if not (kindIs "invalid" .runAsUser) }}
    runAsUser: {{ int64 .runAsUser }}
    {{- end }}
    {{- if not (kindIs "invalid" .runAsGroup) }}
    runAsGroup: {{ int64 .runAsGroup }}
    {{- end }}
    {{- if not (kindIs "invalid" .fsGroup) }}
    fsGroup: {{ int64 .fsGroup }}
    {{- end }}
    {{- end }}
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: purgatory
      image: {{ include "purgatory.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      {{- if include "purgatory.ordinal" . }}
      {{- /* The pod's ordinal (its host name's suffix) picks its partitions from the mounted map. */}}
      command:
        - /bin/sh
        - -c
        - |
          set -eu
          ordinal="${HOSTNAME##*-}"
          owned="{{ include "purgatory.partitionsDir" . }}/${ordinal}"
          if [ ! -r "${owned}" ]; then
            echo "no partitions for pod ordinal ${ordinal}: scale with helm upgrade --set replicaCount=N" >&2
            exit 1
          fi
          PURGATORY_KAFKA_STATIC_PARTITIONS="$(cat "${owned}")"
          PURGATORY_PEER_URLS="$(cat "{{ include "purgatory.partitionsDir" . }}/peers")"
          PURGATORY_REPLICA_ORDINAL="${ordinal}"
          export PURGATORY_KAFKA_STATIC_PARTITIONS PURGATORY_PEER_URLS PURGATORY_REPLICA_ORDINAL
          exec purgatory serve
      {{- end }}
      ports:
        - name: http
          containerPort: {{ int .Values.config.http_port }}
          protocol: TCP
      envFrom:
        - configMapRef:
            name: {{ include "purgatory.fullname" . }}
      {{- $env := list }}
      {{- if not (include "purgatory.ordinal" .) }}
      {{- /* Group mode: the group shares each member's address, so any pod forwards a request to the pod owning the scope's partition. */}}
      {{- $env = append $env (dict "name" "POD_IP" "valueFrom" (dict "fieldRef" (dict "fieldPath" "status.podIP"))) }}
      {{- $env = append $env (dict "name" "PURGATORY_ADVERTISED_URL" "value" (printf "http://$(POD_IP):%d" (int .Values.config.http_port))) }}
      {{- end }}
      {{- if and .Values.kafka.sasl.existingSecret .Values.kafka.sasl.usernameKey }}
      {{- $env = append $env (dict "name" "PURGATORY_KAFKA_SASL_USERNAME" "valueFrom" (dict "secretKeyRef" (dict "name" .Values.kafka.sasl.existingSecret "key" .Values.kafka.sasl.usernameKey))) }}
      {{- end }}
      {{- if .Values.kafka.sasl.existingSecret }}
      {{- $env = append $env (dict "name" "PURGATORY_KAFKA_SASL_PASSWORD_FILE" "value" (printf "%s/password" (include "purgatory.saslDir" .))) }}
      {{- end }}
      {{- if include "purgatory.apiTokenSecret" . }}
      {{- $env = append $env (dict "name" "PURGATORY_API_TOKEN_FILE" "value" (printf "%s/token" (include "purgatory.apiTokenDir" .))) }}
      {{- else }}
      {{- $env = append $env (dict "name" "PURGATORY_ALLOW_UNAUTHENTICATED" "value" "true") }}
      {{- end }}
      {{- with $env }}
      env:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      startupProbe:
        httpGet:
          path: /healthz
          port: http
        periodSeconds: {{ int .Values.probes.startup.periodSeconds }}
        failureThreshold: {{ int .Values.probes.startup.failureThreshold }}
        timeoutSeconds: {{ int .Values.probes.startup.timeoutSeconds }}
      livenessProbe:
        httpGet:
          path: /healthz
          port: http
        periodSeconds: {{ int .Values.probes.liveness.periodSeconds }}
        failureThreshold: {{ int .Values.probes.liveness.failureThreshold }}
        timeoutSeconds: {{ int .Values.probes.liveness.timeoutSeconds }}
      readinessProbe:
        httpGet:
          path: /readyz
          port: http
        periodSeconds: {{ int .Values.probes.readiness.periodSeconds }}
        failureThreshold: {{ int .Values.probes.readiness.failureThreshold }}
        timeoutSeconds: {{ int .Values.probes.readiness.timeoutSeconds }}
      {{- /*
      Kubernetes removes a stopping pod from the Services' endpoints while it runs the hook, not
      before: the pause keeps the pod serving until the proxies and clients have caught up, and
      only then does SIGTERM stop the HTTP server. An exec of the image's sleep, since the native
      sleep action needs Kubernetes 1.30 and the chart supports 1.25.
      */}}
      {{- with int .Values.lifecycle.preStopSleepSeconds }}
      lifecycle:
        preStop:
          exec:
            command:
              - /bin/sleep
              - {{ . | quote }}
      {{- end }}
      {{- with .Values.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- include "purgatory.containerSecurityContext" . | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- if .Values.kafka.sasl.existingSecret }}
        - name: kafka-sasl
          mountPath: {{ include "purgatory.saslDir" . }}
          readOnly: true
        {{- end }}
        {{- if .Values.kafka.tls.existingSecret }}
        - name: kafka-tls
          mountPath: {{ include "purgatory.tlsDir" . }}
          readOnly: true
        {{- end }}
        {{- if include "purgatory.apiTokenSecret" . }}
        - name: api-token
          mountPath: {{ include "purgatory.apiTokenDir" . }}
          readOnly: true
        {{- end }}
        {{- if include "purgatory.ordinal" . }}
        - name: partitions
          mountPath: {{ include "purgatory.partitionsDir" . }}
          readOnly: true
        {{- end }}
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: {{ .Values.tmpSizeLimit }}
    {{- with .Values.kafka.sasl }}
    {{- if .existingSecret }}
    - name: kafka-sasl
      secret:
        secretName: {{ .existingSecret }}
        defaultMode: 0440
        items:
          - key: {{ .passwordKey }}
            path: password
    {{- end }}
    {{- end }}
    {{- with .Values.kafka.tls }}
    {{- if .existingSecret }}
    - name: kafka-tls
      secret:
        secretName: {{ .existingSecret }}
        defaultMode: 0440
        items:
          {{- if .caKey }}
          - key: {{ .caKey }}
            path: ca.crt
          {{- end }}
          {{- if .certKey }}
          - key: {{ .certKey }}
            path: tls.crt
          - key: {{ .keyKey }}
            path: tls.key
          {{- end }}
    {{- end }}
    {{- end }}
    {{- with include "purgatory.apiTokenSecret" . }}
    - name: api-token
      secret:
        secretName: {{ . }}
        defaultMode: 0440
        items:
          - key: {{ ternary $.Values.apiToken.key "token" (ne $.Values.apiToken.existingSecret "") }}
            path: token
    {{- end }}
    {{- if include "purgatory.ordinal" . }}
    - name: partitions
      configMap:
        name: {{ include "purgatory.fullname" . }}-partitions
    {{- end }}
  {{- $selector := dict "matchLabels" (include "purgatory.selectorLabels" . | fromYaml) }}
  {{- $constraints := list }}
  {{- range .Values.topologySpreadConstraints }}
  {{- $constraints = append $constraints (merge (dict) . (dict "labelSelector" $selector)) }}
  {{- end }}
  {{- with $constraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
