// Package nvme is the wire format of NVMe over Fabrics on RDMA: the 64-byte
// submission queue entry (SQE) a command capsule starts with, the 16-byte
// completion queue entry (CQE) a response capsule is, SGL descriptors
// (keyed data blocks with and without the invalidate subtype, the
// in-capsule data block), the NVMe-RDMA private data of the rdma_cm
// connection request, reply and reject, the Fabrics commands (Connect with
// its 1024-byte data, Property Get/Set, Disconnect), the admin commands a
// fabrics host uses (Identify with the controller, namespace, active
// namespace list and namespace descriptor structures, Get/Set Features,
// Get Log Page with the discovery log page, Keep Alive, Asynchronous Event
// Request) and the NVM I/O commands (Read, Write, Flush, Write Zeroes,
// Dataset Management).
//
// The style is gVisor's pkg/tcpip/header: a type per structure that is a
// byte slice view (SQE, CQE, SGL, ...), accessors that read and write the
// fields in place, a Fields struct with an Encode method for whole
// structures, and Parse functions that check the length of untrusted
// input. NVMe is little-endian. Nothing allocates except the Fields of
// variable-length structures.
//
// Sources of the layouts: the NVM Express Base and Fabrics specifications,
// Linux include/linux/nvme.h and include/linux/nvme-rdma.h, checked against
// the golden capture of Linux's nvme-rdma host and nvmet-rdma target
// (testdata/golden/nvmeof_rdma_linux.pcap).
//
// A wire package: it imports nothing of this module.
package nvme
