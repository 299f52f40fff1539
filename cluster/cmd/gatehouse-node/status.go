package main

import (
	"context"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
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

// statusEqual compares two computed statuses, ignoring condition transition times (set
// when the status is computed; writeStatus keeps the stored ones).
func statusEqual(a, b *corev1.PodStatus) bool {
	strip := func(s *corev1.PodStatus) *corev1.PodStatus {
		s = s.DeepCopy()
		for i := range s.Conditions {
			s.Conditions[i].LastTransitionTime = metav1.Time{}
		}
		return s
	}
	return equality.Semantic.DeepEqual(strip(a), strip(b))
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
		// Also while the Pod terminates: readiness keeps being reported until the
		// containers exit, as the kubelet does (EndpointSlices mark endpoints serving).
		if cur.UID != rt.uid {
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
	// The kubelet's phase: Pending while a container never ran, Succeeded or Failed when
	// every container exited for good, Running otherwise (also while one restarts).
	allRunning, neverRan, allDone, allZero := len(rt.containers) > 0, false, len(rt.containers) > 0, true
	for _, c := range rt.containers {
		cs := c.status()
		if cs.State.Running == nil {
			allRunning = false
		}
		if cs.State.Running == nil && cs.LastTerminationState.Terminated == nil && cs.State.Terminated == nil {
			neverRan = true
		}
		if t := cs.State.Terminated; t == nil {
			allDone = false
		} else if t.ExitCode != 0 {
			allZero = false
		}
		s.ContainerStatuses = append(s.ContainerStatuses, cs)
	}
	switch {
	case failure != "":
		s.Reason, s.Message = "GatehouseNodeUnsupported", failure
		if strings.HasPrefix(failure, "SysctlForbidden:") {
			s.Reason = "SysctlForbidden"
		}
	case pending != "":
		s.Message = "FailedMount: " + pending
	case allDone && allZero:
		s.Phase = corev1.PodSucceeded
	case allDone:
		s.Phase = corev1.PodFailed
	case !neverRan:
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
