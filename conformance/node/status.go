package main

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// statusLoop writes the Pod's status whenever something changed, coalescing bursts,
// until the Pod is stopped.
func (rt *podRuntime) statusLoop() {
	var last *corev1.PodStatus
	for {
		select {
		case <-rt.ctx.Done():
			return
		case <-rt.dirty:
		}
		next := rt.status()
		if last != nil && statusEqual(last, next) {
			continue
		}
		if err := rt.writeStatus(next); err != nil {
			if rt.ctx.Err() != nil || apierrors.IsNotFound(err) {
				return
			}
			rt.logf("status: %v", err)
			time.AfterFunc(time.Second, rt.changed)
			continue
		}
		last = next
	}
}

func statusEqual(a, b *corev1.PodStatus) bool {
	if a.Phase != b.Phase || a.PodIP != b.PodIP || a.Reason != b.Reason || len(a.ContainerStatuses) != len(b.ContainerStatuses) {
		return false
	}
	for i := range a.ContainerStatuses {
		x, y := a.ContainerStatuses[i], b.ContainerStatuses[i]
		if x.Ready != y.Ready || x.RestartCount != y.RestartCount || x.ContainerID != y.ContainerID ||
			(x.State.Waiting == nil) != (y.State.Waiting == nil) || (x.State.Running == nil) != (y.State.Running == nil) {
			return false
		}
		if x.State.Waiting != nil && y.State.Waiting != nil && *x.State.Waiting != *y.State.Waiting {
			return false
		}
	}
	return true
}

func (rt *podRuntime) writeStatus(next *corev1.PodStatus) error {
	client := rt.agent.client.CoreV1().Pods(rt.pod.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ctx, cancel := context.WithTimeout(rt.ctx, 10*time.Second)
		defer cancel()
		cur, err := client.Get(ctx, rt.pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != rt.uid || cur.DeletionTimestamp != nil {
			return nil
		}
		s := next.DeepCopy()
		s.QOSClass = cur.Status.QOSClass
		// Keep transition times of conditions that did not change.
		for i := range s.Conditions {
			for _, old := range cur.Status.Conditions {
				if old.Type == s.Conditions[i].Type && old.Status == s.Conditions[i].Status {
					s.Conditions[i].LastTransitionTime = old.LastTransitionTime
				}
			}
		}
		cur.Status = *s
		_, err = client.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

// status is the Pod status the kubelet would report for the current state.
func (rt *podRuntime) status() *corev1.PodStatus {
	rt.mu.Lock()
	addr, failure, pending, started := rt.addr, rt.failure, rt.pending, rt.started
	rt.mu.Unlock()
	now := metav1.Now()
	cond := func(t corev1.PodConditionType, ok bool, reason string) corev1.PodCondition {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, Reason: reason, LastTransitionTime: now}
		if ok {
			c.Status, c.Reason = corev1.ConditionTrue, ""
		}
		return c
	}
	s := &corev1.PodStatus{
		Phase:     corev1.PodPending,
		HostIP:    rt.agent.network.gateway.String(),
		HostIPs:   []corev1.HostIP{{IP: rt.agent.network.gateway.String()}},
		StartTime: &started,
	}
	if addr != nil {
		s.PodIP = addr.String()
		s.PodIPs = []corev1.PodIP{{IP: addr.String()}}
	}
	allRunning := len(rt.containers) > 0
	for _, c := range rt.containers {
		cs := c.status()
		if cs.State.Running == nil {
			allRunning = false
		}
		s.ContainerStatuses = append(s.ContainerStatuses, cs)
	}
	if failure != "" {
		s.Reason, s.Message = "GatehouseNodeUnsupported", failure
	} else if pending != "" {
		s.Message = "FailedMount: " + pending
	}
	if allRunning && failure == "" {
		s.Phase = corev1.PodRunning
	}
	ready := allRunning && failure == "" && rt.ready()
	s.Conditions = []corev1.PodCondition{
		cond(corev1.PodReadyToStartContainers, addr != nil, "NetworkNotReady"),
		cond(corev1.PodInitialized, true, ""),
		cond(corev1.ContainersReady, ready, "ContainersNotReady"),
		cond(corev1.PodReady, ready, "ContainersNotReady"),
		cond(corev1.PodScheduled, true, ""),
	}
	return s
}
