{{/*
The jobwarden container of the StatefulSet's pods, as one item of a list: an init container
with restartPolicy: Always (sidecar.mode native) or the last of containers[] (classic).
*/}}
{{- define "jobwarden.sidecar" -}}
{{- $opsPort := include "jobwarden.opsPort" . | int }}
{{- $creds := .Values.secrets.natsCredentials }}
{{- $tls := .Values.secrets.natsTls }}
- name: jobwarden
  image: {{ include "jobwarden.image" . }}
  {{- with .Values.image.pullPolicy }}
  imagePullPolicy: {{ . }}
  {{- end }}
  {{- if eq .Values.sidecar.mode "native" }}
  # Native sidecar: runs for the pod's whole life, restarted when it exits.
  restartPolicy: Always
  {{- end }}
  args:
  {{- toYaml .Values.worker.args | nindent 2 }}
  env:
  - name: JOBWARDEN_CONFIG
    value: /etc/jobwarden/jobwarden.toml
  # The pod's name is the worker's hostname: worker ids begin with it.
  - name: JOBWARDEN_WORKER__HOSTNAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  - name: JOBWARDEN_DATABASE__URL
    valueFrom:
      secretKeyRef:
        name: {{ .Values.secrets.database.name }}
        key: {{ .Values.secrets.database.key }}
  - name: JOBWARDEN_POD_TERMINATION_GRACE_SECONDS
    value: {{ .Values.terminationGracePeriodSeconds | int | quote }}
  - name: JOBWARDEN_LOG_JSON
    value: {{ .Values.worker.logJson | toString | quote }}
  - name: RUST_LOG
    value: {{ .Values.worker.logLevel | quote }}
  {{- if .Values.nack.enabled }}
  # NACK provisions the stream and the consumers.
  - name: JOBWARDEN_NATS__PROVISION
    value: "false"
  {{- end }}
  {{- with .Values.worker.env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  ports:
  - name: ops
    containerPort: {{ $opsPort }}
  startupProbe:
    httpGet:
      path: /readyz
      port: ops
    {{- toYaml .Values.worker.startupProbe | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: ops
    {{- toYaml .Values.worker.readinessProbe | nindent 4 }}
  livenessProbe:
    httpGet:
      path: /livez
      port: ops
    {{- toYaml .Values.worker.livenessProbe | nindent 4 }}
  resources:
    {{- toYaml .Values.worker.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.worker.securityContext | nindent 4 }}
  volumeMounts:
  - name: config
    mountPath: /etc/jobwarden
    readOnly: true
  {{- if $creds.name }}
  - name: nats-creds
    mountPath: {{ $creds.mountPath }}
    readOnly: true
  {{- end }}
  {{- if $tls.name }}
  - name: nats-tls
    mountPath: {{ $tls.mountPath }}
    readOnly: true
  {{- end }}
  - name: jobwarden-tmp
    mountPath: /tmp
  {{- with .Values.worker.volumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
