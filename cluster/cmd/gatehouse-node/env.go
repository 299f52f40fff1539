package main

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// containerEnv builds the container's environment the way the kubelet does for the
// sources used by test workloads: literal values with $(VAR) expansion, downward-API
// fieldRefs, Secret and ConfigMap keys, and envFrom. Anything else is an error, which
// keeps the container from starting (visible in its status) instead of running it wrong.
//
// base comes first (the defaults, an image's own Env, the Service variables); later entries
// win, and $(VAR) can refer to earlier ones.
func (rt *podRuntime) containerEnv(ctx context.Context, c *corev1.Container, base []string) ([]string, error) {
	env := append([]string(nil), base...)
	for _, from := range c.EnvFrom {
		var data map[string]string
		switch {
		case from.ConfigMapRef != nil:
			cm, err := rt.configMap(ctx, from.ConfigMapRef.Name, from.ConfigMapRef.Optional)
			if err != nil {
				return nil, fmt.Errorf("envFrom configMap %s: %w", from.ConfigMapRef.Name, err)
			}
			if cm != nil {
				data = cm.Data
			}
		case from.SecretRef != nil:
			s, err := rt.secret(ctx, from.SecretRef.Name, from.SecretRef.Optional)
			if err != nil {
				return nil, fmt.Errorf("envFrom secret %s: %w", from.SecretRef.Name, err)
			}
			if s != nil {
				data = map[string]string{}
				for k, v := range s.Data {
					data[k] = string(v)
				}
			}
		}
		for k, v := range data {
			env = append(env, from.Prefix+k+"="+v)
		}
	}
	for _, e := range c.Env {
		v, err := rt.envValue(ctx, e, env)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		env = append(env, e.Name+"="+v)
	}
	return env, nil
}

// serviceEnv is the Pod's Service environment (see serviceEnv in services.go), computed at
// every container start from the Services known then, as the kubelet does.
func (rt *podRuntime) serviceEnv() []string {
	if rt.agent.view == nil {
		return nil
	}
	links := rt.pod.Spec.EnableServiceLinks == nil || *rt.pod.Spec.EnableServiceLinks
	return serviceEnv(rt.agent.view.all(), rt.pod.Namespace, links)
}

// secret fetches a Secret the Pod refers to; nil without an error when it cannot be read and
// the reference is optional.
func (rt *podRuntime) secret(ctx context.Context, name string, optional *bool) (*corev1.Secret, error) {
	s, err := rt.agent.client.CoreV1().Secrets(rt.pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil && optional != nil && *optional {
		return nil, nil
	}
	return s, err
}

// configMap is secret for ConfigMaps.
func (rt *podRuntime) configMap(ctx context.Context, name string, optional *bool) (*corev1.ConfigMap, error) {
	cm, err := rt.agent.client.CoreV1().ConfigMaps(rt.pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil && optional != nil && *optional {
		return nil, nil
	}
	return cm, err
}

func (rt *podRuntime) envValue(ctx context.Context, e corev1.EnvVar, env []string) (string, error) {
	if e.ValueFrom == nil {
		return expand(e.Value, env), nil
	}
	switch f := e.ValueFrom; {
	case f.FieldRef != nil:
		return rt.fieldValue(f.FieldRef.FieldPath)
	case f.SecretKeyRef != nil:
		s, err := rt.secret(ctx, f.SecretKeyRef.Name, f.SecretKeyRef.Optional)
		if err != nil || s == nil {
			return "", err
		}
		return string(s.Data[f.SecretKeyRef.Key]), nil
	case f.ConfigMapKeyRef != nil:
		cm, err := rt.configMap(ctx, f.ConfigMapKeyRef.Name, f.ConfigMapKeyRef.Optional)
		if err != nil || cm == nil {
			return "", err
		}
		return cm.Data[f.ConfigMapKeyRef.Key], nil
	default:
		return "", fmt.Errorf("this valueFrom source is not supported by gatehouse-node")
	}
}

// fieldValue resolves a downward-API field path.
func (rt *podRuntime) fieldValue(path string) (string, error) {
	p := rt.pod
	rt.mu.Lock()
	addr := rt.addr
	rt.mu.Unlock()
	switch path {
	case "metadata.name":
		return p.Name, nil
	case "metadata.namespace":
		return p.Namespace, nil
	case "metadata.uid":
		return string(p.UID), nil
	case "spec.nodeName":
		return rt.agent.cfg.nodeName, nil
	case "spec.serviceAccountName":
		return p.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return rt.agent.network.gateway.String(), nil
	case "status.podIP", "status.podIPs":
		if addr == nil {
			return "", fmt.Errorf("pod has no IP yet")
		}
		return addr.String(), nil
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": p.Labels, "metadata.annotations": p.Annotations} {
		if path == prefix {
			var lines []string
			for k, v := range m {
				lines = append(lines, fmt.Sprintf("%s=%q", k, v))
			}
			return strings.Join(lines, "\n"), nil
		}
		if strings.HasPrefix(path, prefix+"['") && strings.HasSuffix(path, "']") {
			return m[path[len(prefix)+2:len(path)-2]], nil
		}
	}
	return "", fmt.Errorf("field path %q is not supported", path)
}

// expand replaces $(NAME) with earlier variables, leaving unknown references as they
// are and turning $$ into $, as the kubelet does.
func expand(s string, env []string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	lookup := func(name string) (string, bool) {
		for i := len(env) - 1; i >= 0; i-- {
			if k, v, _ := strings.Cut(env[i], "="); k == name {
				return v, true
			}
		}
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '$' && i+1 < len(s) && s[i+1] == '$':
			b.WriteByte('$')
			i++
		case s[i] == '$' && i+1 < len(s) && s[i+1] == '(':
			end := strings.IndexByte(s[i:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+end+1])
			}
			i += end
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

func expandAll(args, env []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = expand(a, env)
	}
	return out
}
