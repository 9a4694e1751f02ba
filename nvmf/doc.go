// Package nvmf is NVMe over Fabrics on RDMA (RoCEv2) on this module's
// stack: a target (Listen) that Linux's nvme-rdma host connects to, and a
// host (Connect, Discover) that reads and writes Linux's nvmet-rdma — or
// each other.
//
// Every NVMe queue is its own rdma_cm connection (package rdmacm) to port
// 4420 in the TCP port space, with the NVMe-RDMA private data of package
// nvme in the request, reply or reject: the admin queue (qid 0, 32
// entries) first, then the I/O queues. Commands travel as 64-byte
// capsules in RDMA SENDs, with in-capsule data for small writes on I/O
// queues; larger data moves by keyed SGLs: the target RDMA READs what the
// host writes and RDMA WRITEs what it reads, before the 16-byte response
// SEND (a SEND with Invalidate of the SGL's key when the host asks, as
// Linux's host does).
//
// The target serves subsystems whose namespaces are Backends (a file, a
// block device, memory) and the discovery controller
// (nqn.2014-08.org.nvmexpress.discovery) that lists them. It implements
// the Fabrics commands (Connect, Property Get/Set, Disconnect), the admin
// commands a fabrics host uses (Identify, Get/Set Features, Get Log Page,
// Keep Alive, Asynchronous Event Request, Abort) and Read, Write, Flush,
// Write Zeroes and Dataset Management; controller enable, reset and
// shutdown through CC/CSTS; the keep-alive timer; any number of hosts.
// Namespaces change while it runs (Target.AddNamespace, RemoveNamespace,
// RevalidateNamespace), and the connected hosts learn of it through the
// Namespace Attribute Changed event and the Changed Namespace List, as
// from nvmet. Every error is an NVMe status or an NVMe-RDMA reject,
// counted in Stats.
//
// The host's Controller connects the admin queue and N I/O queues,
// enables and identifies the controller, keeps it alive and reconnects
// after losing it or after a command went unanswered (AdminTimeout on
// the admin queue, IOTimeout on the I/O queues),
// checking that each namespace is still the same disk (and, with
// HostConfig.OnNamespaceChange, reports the target's namespace change
// events); its HostNamespace has ReadAt/WriteAt (and context
// variants) that are safe for concurrent use, so that many goroutines keep
// many commands in flight.
//
// docs/NVMEOF.md describes the commands (rocev2d nvmf-target, rocev2d
// nvmf-host) and the interop cells against Linux.
package nvmf
