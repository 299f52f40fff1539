package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// writeVolumes materialises the Pod's volumes as directories under the Pod's state dir;
// containers see them at their mountPath through a bind mount (see execContainer). The
// contents are written once at start; Secret and ConfigMap updates are not propagated.
// An emptyDir is mode 0777 as the kubelet makes it; with medium Memory it is a tmpfs
// mounted on the host (unmounted when the Pod goes; cluster/down unmounts leftovers).
func (rt *podRuntime) writeVolumes() error {
	for _, v := range rt.pod.Spec.Volumes {
		dir := rt.volumeDir(v.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := rt.writeVolume(v, dir); err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
		if sc := rt.pod.Spec.SecurityContext; sc != nil && sc.FSGroup != nil {
			if err := applyFSGroup(dir, int(*sc.FSGroup)); err != nil {
				return fmt.Errorf("volume %s: fsGroup: %w", v.Name, err)
			}
		}
	}
	return nil
}

// applyFSGroup gives the volume to the Pod's fsGroup as the kubelet does: every file and
// directory group-owned by it and group-readable (directories also group-searchable and
// setgid, so files created later inherit the group). Without it a non-root container cannot
// read a Secret volume whose files are root's with mode 0440.
func applyFSGroup(dir string, gid int) error {
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(p, -1, gid); err != nil {
			return err
		}
		if d.Type()&os.ModeSymlink != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := info.Mode()
		if d.IsDir() {
			return os.Chmod(p, mode.Perm()|0o050|os.ModeSetgid)
		}
		return os.Chmod(p, mode.Perm()|0o040)
	})
}

func (rt *podRuntime) volumeDir(name string) string {
	return filepath.Join(rt.dir, "volumes", name)
}

func (rt *podRuntime) writeVolume(v corev1.Volume, dir string) error {
	ctx := rt.ctx
	switch {
	case v.EmptyDir != nil:
		if v.EmptyDir.Medium == corev1.StorageMediumMemory && !slices.Contains(rt.tmpfs, dir) {
			opts := "mode=0777"
			if l := v.EmptyDir.SizeLimit; l != nil && l.Value() > 0 {
				opts += fmt.Sprintf(",size=%d", l.Value())
			}
			if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
				return fmt.Errorf("tmpfs: %w", err)
			}
			rt.tmpfs = append(rt.tmpfs, dir)
		}
		return os.Chmod(dir, 0o777)
	case v.Secret != nil:
		s, err := rt.secret(ctx, v.Secret.SecretName, v.Secret.Optional)
		if err != nil || s == nil {
			return err
		}
		return writeKeys(dir, s.Data, v.Secret.Items, v.Secret.DefaultMode)
	case v.ConfigMap != nil:
		cm, err := rt.configMap(ctx, v.ConfigMap.Name, v.ConfigMap.Optional)
		if err != nil || cm == nil {
			return err
		}
		return writeKeys(dir, configMapBytes(cm), v.ConfigMap.Items, v.ConfigMap.DefaultMode)
	case v.DownwardAPI != nil:
		return rt.writeDownward(dir, v.DownwardAPI.Items, v.DownwardAPI.DefaultMode)
	case v.Projected != nil:
		mode := v.Projected.DefaultMode
		for _, src := range v.Projected.Sources {
			var err error
			switch {
			case src.ServiceAccountToken != nil:
				err = rt.writeToken(ctx, dir, src.ServiceAccountToken, mode)
			case src.ConfigMap != nil:
				var cm *corev1.ConfigMap
				if cm, err = rt.configMap(ctx, src.ConfigMap.Name, src.ConfigMap.Optional); cm != nil {
					err = writeKeys(dir, configMapBytes(cm), src.ConfigMap.Items, mode)
				}
			case src.Secret != nil:
				var s *corev1.Secret
				if s, err = rt.secret(ctx, src.Secret.Name, src.Secret.Optional); s != nil {
					err = writeKeys(dir, s.Data, src.Secret.Items, mode)
				}
			case src.DownwardAPI != nil:
				err = rt.writeDownward(dir, src.DownwardAPI.Items, mode)
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

func writeKeys(dir string, data map[string][]byte, items []corev1.KeyToPath, defaultMode *int32) error {
	if len(items) == 0 {
		for k, v := range data {
			if err := writeFile(dir, k, v, defaultMode); err != nil {
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
		mode := defaultMode
		if it.Mode != nil {
			mode = it.Mode
		}
		if err := writeFile(dir, it.Path, v, mode); err != nil {
			return err
		}
	}
	return nil
}

// writeFile writes a volume file with the volume's or item's mode (default 0644, as the API
// server defaults it).
func writeFile(dir, rel string, data []byte, mode *int32) error {
	p := filepath.Join(dir, rel)
	if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
		return fmt.Errorf("path %q escapes the volume", rel)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	perm := uint32(0o644)
	if mode != nil {
		perm = uint32(*mode) & 0o777
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return err
	}
	return unix.Chmod(p, perm)
}

func (rt *podRuntime) writeDownward(dir string, items []corev1.DownwardAPIVolumeFile, defaultMode *int32) error {
	for _, it := range items {
		if it.FieldRef == nil {
			return fmt.Errorf("downwardAPI item %s: only fieldRef is supported", it.Path)
		}
		v, err := rt.fieldValue(it.FieldRef.FieldPath)
		if err != nil {
			return err
		}
		mode := defaultMode
		if it.Mode != nil {
			mode = it.Mode
		}
		if err := writeFile(dir, it.Path, []byte(v), mode); err != nil {
			return err
		}
	}
	return nil
}

func (rt *podRuntime) writeToken(ctx context.Context, dir string, src *corev1.ServiceAccountTokenProjection, mode *int32) error {
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
	return writeFile(dir, src.Path, []byte(tok.Status.Token), mode)
}

// mounts lists the container's volume mounts as SOURCE=TARGET[:ro] for execContainer.
func (rt *podRuntime) mounts(c *corev1.Container) ([]string, error) {
	var out []string
	for _, m := range c.VolumeMounts {
		src := rt.volumeDir(m.Name)
		if m.SubPath != "" {
			src = filepath.Join(src, m.SubPath)
			if !strings.HasPrefix(src, rt.volumeDir(m.Name)+string(filepath.Separator)) {
				return nil, fmt.Errorf("volume mount %s: subPath %q escapes the volume", m.Name, m.SubPath)
			}
			if _, err := os.Lstat(src); os.IsNotExist(err) {
				_ = os.MkdirAll(src, 0o777) // the kubelet creates a missing subPath directory
			}
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
