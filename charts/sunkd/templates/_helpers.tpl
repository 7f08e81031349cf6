{{/* Names, labels and small pieces shared by the templates. */}}

{{- define "sunkd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "sunkd" for a release named sunkd (or containing the chart name), else RELEASE-sunkd. */}}
{{- define "sunkd.fullname" -}}
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

{{- define "sunkd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object: kustomize's (name, part-of) plus Helm's usual ones. */}}
{{- define "sunkd.labels" -}}
helm.sh/chart: {{ include "sunkd.chart" . }}
app.kubernetes.io/name: {{ include "sunkd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: sunkd
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The controller pods: selected by name, instance and component. */}}
{{- define "sunkd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sunkd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "sunkd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sunkd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sunkd.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* Where the Slurm credentials Secret is mounted, and the file sunkd reads in it. */}}
{{- define "sunkd.slurmCredentialsDir" -}}/etc/sunkd/slurm{{- end }}

{{- define "sunkd.schedulerUrl" -}}
{{- if .Values.schedulerConfig.urlPrefix }}
{{- .Values.schedulerConfig.urlPrefix }}
{{- else }}
{{- printf "http://%s.%s.svc.cluster.local:%d/scheduler" (include "sunkd.fullname" .) .Release.Namespace (int .Values.service.port) }}
{{- end }}
{{- end }}

{{/* A newline and one TOML `key = value` line, indented for the ConfigMap's block
     scalar; nothing when the value is null. The value is JSON-encoded, which is valid
     TOML for strings, numbers, booleans and arrays of them; a map becomes an inline table. */}}
{{- define "sunkd.tomlKey" -}}
{{- $key := index . 0 }}{{ $value := index . 1 }}
{{- if kindIs "map" $value }}
{{- $pairs := list }}
{{- range $k := keys $value | sortAlpha }}
{{- $pairs = append $pairs (printf "%s = %s" (toJson $k) (index $value $k | toJson)) }}
{{- end }}
{{- printf "\n    %s = { %s }" $key (join ", " $pairs) }}
{{- else if not (kindIs "invalid" $value) }}
{{- printf "\n    %s = %s" $key (toJson $value) }}
{{- end }}
{{- end }}
