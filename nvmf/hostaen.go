package nvmf

import (
	"context"
	"encoding/binary"
	"errors"

	"github.com/gorocev2/rocev2/nvme"
)

// startEvents starts a's event goroutine (events) when the caller wants
// namespace change notices and the controller sends them. rescan: a is a
// reconnect's association.
func (h *Controller) startEvents(a *association, rescan bool) {
	if h.cfg.OnNamespaceChange == nil || h.subNQN == nvme.DiscoveryNQN || a.id.OAES&aenNSAttr == 0 {
		return
	}
	h.wg.Add(1)
	go h.events(a, rescan)
}

// nsChanged calls HostConfig.OnNamespaceChange, one call at a time: the
// goroutine of an association that ended may still be in it when the
// next association's starts.
func (h *Controller) nsChanged(ids []uint32) {
	h.nsCBMu.Lock()
	defer h.nsCBMu.Unlock()
	h.cfg.OnNamespaceChange(ids)
}

// events enables namespace attribute notices on a (as Linux's
// nvme_enable_aen) and keeps one AER outstanding until a ends or the
// controller closes. A Namespace Attribute Changed notice reads log page
// 04h with RAE clear (the controller sends the next notice only then)
// and hands its NSIDs to HostConfig.OnNamespaceChange; other events are
// ignored. An AER that ends with an error status (the controller was
// reset, or refuses AERs) ends the goroutine: a reconnect starts another,
// which first reports "changed, which not known" (nil), as Linux's host
// rescans at every controller start (nvme_start_ctrl queues a scan): the
// new controller's Changed Namespace List does not hold what changed
// while the host was away.
func (h *Controller) events(a *association, rescan bool) {
	defer h.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-h.closeCh:
		case <-a.dead:
		case <-ctx.Done():
		}
		cancel()
	}()
	f := nvme.Features{FID: nvme.FeatAsyncEvent, Value: aenNSAttr}
	if _, err := a.admin.do(ctx, &request{build: func(s nvme.SQE) { f.Put(s, nvme.AdminSetFeatures) }}); err != nil {
		h.logf("nvmf: controller %v %s: Set Features (async event configuration): %v; no namespace change events", h.addr, h.subNQN, err)
		return
	}
	if rescan {
		h.nsChanged(nil)
	}
	for ctx.Err() == nil {
		res, err := a.admin.do(ctx, &request{timeout: -1, build: func(s nvme.SQE) { s.SetOpcode(nvme.AdminAsyncEvent) }})
		if err != nil {
			select {
			case <-h.closeCh: // Close's shutdown ends the AER
			default:
				if errors.As(err, new(nvme.Status)) {
					h.logf("nvmf: controller %v %s: Asynchronous Event Request: %v", h.addr, h.subNQN, err)
				}
			}
			return
		}
		ev := nvme.ParseAsyncEvent(res)
		if ev.Type != nvme.AENotice || ev.Info != aeNoticeNSChanged || ev.LID != nvme.LogChangedNS {
			h.logf("nvmf: controller %v %s: asynchronous event %#x ignored", h.addr, h.subNQN, res)
			continue
		}
		page := make([]byte, maxChangedNS*4)
		g := nvme.GetLogPage{LID: nvme.LogChangedNS, NumD: maxChangedNS}
		var ids []uint32
		if _, err := a.admin.do(ctx, &request{in: page, build: g.Put}); err != nil {
			h.logf("nvmf: controller %v %s: Changed Namespace List: %v", h.addr, h.subNQN, err)
			if !errors.As(err, new(nvme.Status)) {
				return
			}
		} else {
			ids = changedNSIDs(page)
		}
		h.nsChanged(ids) // nil: which is not known
	}
}

// changedNSIDs decodes a Changed Namespace List: its NSIDs up to the
// first zero, or nil when the first is FFFFFFFFh (more than 1024
// changed: every namespace may have).
func changedNSIDs(page []byte) []uint32 {
	ids := []uint32{}
	for i := 0; i+4 <= len(page); i += 4 {
		v := binary.LittleEndian.Uint32(page[i:])
		if v == 0 {
			break
		}
		if v == 0xffffffff {
			return nil
		}
		ids = append(ids, v)
	}
	return ids
}
