package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// writeVolumes materialises the Pod's volumes as directories under the Pod's state dir;
// containers see them at their mountPath through a bind mount (see execContainer). The
// contents are written once at start; Secret and ConfigMap updates are not propagated.
func (rt *podRuntime) writeVolumes() error {
	for _, v := range rt.pod.Spec.Volumes {
		dir := rt.volumeDir(v.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := rt.writeVolume(v, dir); err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
	}
	return nil
}

func (rt *podRuntime) volumeDir(name string) string {
	return filepath.Join(rt.dir, "volumes", name)
}

func (rt *podRuntime) writeVolume(v corev1.Volume, dir string) error {
	ctx := rt.ctx
	switch {
	case v.EmptyDir != nil:
		return nil
	case v.Secret != nil:
		s, err := rt.secret(ctx, v.Secret.SecretName, v.Secret.Optional)
		if err != nil || s == nil {
			return err
		}
		return writeKeys(dir, s.Data, v.Secret.Items)
	case v.ConfigMap != nil:
		cm, err := rt.configMap(ctx, v.ConfigMap.Name, v.ConfigMap.Optional)
		if err != nil || cm == nil {
			return err
		}
		return writeKeys(dir, configMapBytes(cm), v.ConfigMap.Items)
	case v.DownwardAPI != nil:
		return rt.writeDownward(dir, v.DownwardAPI.Items)
	case v.Projected != nil:
		for _, src := range v.Projected.Sources {
			var err error
			switch {
			case src.ServiceAccountToken != nil:
				err = rt.writeToken(ctx, dir, src.ServiceAccountToken)
			case src.ConfigMap != nil:
				var cm *corev1.ConfigMap
				if cm, err = rt.configMap(ctx, src.ConfigMap.Name, src.ConfigMap.Optional); cm != nil {
					err = writeKeys(dir, configMapBytes(cm), src.ConfigMap.Items)
				}
			case src.Secret != nil:
				var s *corev1.Secret
				if s, err = rt.secret(ctx, src.Secret.Name, src.Secret.Optional); s != nil {
					err = writeKeys(dir, s.Data, src.Secret.Items)
				}
			case src.DownwardAPI != nil:
				err = rt.writeDownward(dir, src.DownwardAPI.Items)
			default:
				err = fmt.Errorf("this projected source is not supported by gatehouse-node")
			}
			if err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("this volume type is not supported by gatehouse-node")
	}
}

func configMapBytes(cm *corev1.ConfigMap) map[string][]byte {
	out := map[string][]byte{}
	for k, v := range cm.Data {
		out[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		out[k] = v
	}
	return out
}

func writeKeys(dir string, data map[string][]byte, items []corev1.KeyToPath) error {
	if len(items) == 0 {
		for k, v := range data {
			if err := writeFile(dir, k, v); err != nil {
				return err
			}
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			return fmt.Errorf("key %q not found", it.Key)
		}
		if err := writeFile(dir, it.Path, v); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(dir, rel string, data []byte) error {
	p := filepath.Join(dir, rel)
	if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
		return fmt.Errorf("path %q escapes the volume", rel)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, data, 0o644)
}

func (rt *podRuntime) writeDownward(dir string, items []corev1.DownwardAPIVolumeFile) error {
	for _, it := range items {
		if it.FieldRef == nil {
			return fmt.Errorf("downwardAPI item %s: only fieldRef is supported", it.Path)
		}
		v, err := rt.fieldValue(it.FieldRef.FieldPath)
		if err != nil {
			return err
		}
		if err := writeFile(dir, it.Path, []byte(v)); err != nil {
			return err
		}
	}
	return nil
}

func (rt *podRuntime) writeToken(ctx context.Context, dir string, src *corev1.ServiceAccountTokenProjection) error {
	sa := rt.pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: src.ExpirationSeconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: rt.pod.Name, UID: rt.uid},
	}}
	if src.Audience != "" {
		req.Spec.Audiences = []string{src.Audience}
	}
	tok, err := rt.agent.client.CoreV1().ServiceAccounts(rt.pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("service account token: %w", err)
	}
	return writeFile(dir, src.Path, []byte(tok.Status.Token))
}

// mounts lists the container's volume mounts as SOURCE=TARGET[:ro] for execContainer.
func (rt *podRuntime) mounts(c *corev1.Container) ([]string, error) {
	var out []string
	for _, m := range c.VolumeMounts {
		src := rt.volumeDir(m.Name)
		if m.SubPath != "" {
			src = filepath.Join(src, m.SubPath)
		}
		if _, err := os.Stat(src); err != nil {
			return nil, fmt.Errorf("volume mount %s: %w", m.Name, err)
		}
		spec := src + "=" + m.MountPath
		if m.ReadOnly {
			spec += ":ro"
		}
		out = append(out, spec)
	}
	return out, nil
}

type mountFlags []string

func (m *mountFlags) String() string     { return strings.Join(*m, ",") }
func (m *mountFlags) Set(v string) error { *m = append(*m, v); return nil }

// execContainer runs inside `ip netns exec`, which already gave it a private mount
// namespace: bind the Pod's volumes to their mount paths, then become the container.
// The mount points are created on the host filesystem if missing (empty directories).
func execContainer(args []string) {
	fs := flag.NewFlagSet("exec-container", flag.ExitOnError)
	var mounts mountFlags
	fs.Var(&mounts, "mount", "SOURCE=TARGET[:ro]")
	workdir := fs.String("workdir", "/", "working directory")
	_ = fs.Parse(args)
	argv := fs.Args()
	if len(argv) == 0 {
		log.Fatal("exec-container: no command")
	}
	for _, m := range mounts {
		src, target, _ := strings.Cut(m, "=")
		ro := strings.HasSuffix(target, ":ro")
		target = strings.TrimSuffix(target, ":ro")
		if st, err := os.Stat(src); err == nil && !st.IsDir() {
			_ = os.MkdirAll(filepath.Dir(target), 0o755)
			if f, err := os.OpenFile(target, os.O_CREATE, 0o644); err == nil {
				_ = f.Close()
			}
		} else if err := os.MkdirAll(target, 0o755); err != nil {
			log.Fatalf("exec-container: mount point %s: %v", target, err)
		}
		if err := syscall.Mount(src, target, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			log.Fatalf("exec-container: bind %s on %s: %v", src, target, err)
		}
		if ro {
			if err := syscall.Mount("", target, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
				log.Fatalf("exec-container: read-only %s: %v", target, err)
			}
		}
	}
	if err := os.Chdir(*workdir); err != nil {
		log.Fatalf("exec-container: workdir %s: %v", *workdir, err)
	}
	if err := syscall.Exec(argv[0], argv, os.Environ()); err != nil {
		log.Fatalf("exec-container: exec %s: %v", argv[0], err)
	}
}
