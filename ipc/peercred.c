/* peercred.c: SO_PEERCRED. */
#include <assert.h>
#include <errno.h>
#include <sys/socket.h>

#include "ipc/peercred.h"

int peercred_get(int sock, PeerCred *ret)
{
	struct ucred uc;
	socklen_t len = sizeof(uc);

	assert(ret);
	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
		return -errno;
	if (len != sizeof(uc))
		return -EIO;
	/* a socket that was never connected reports pid 0 and uid/gid -1 */
	if (uc.pid <= 0)
		return -ENOTCONN;
	*ret = (PeerCred){ .pid = uc.pid, .uid = uc.uid, .gid = uc.gid };
	return 0;
}
