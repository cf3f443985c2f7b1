/*
 * test-peercred.c: ipc/peercred.h. Over a socketpair the peer is this
 * process; over a real listening socket in a temporary directory, a forked
 * child connects and the accepting side must see the child's pid (and our
 * uid/gid, the child's too). Non-sockets and unconnected sockets are errors.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/peercred.h"
#include "tests/unit/testutil.h"

START_TEST(test_socketpair)
{
	PeerCred c = { 0 };
	int sv[2];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(peercred_get(sv[i], &c), 0);
		ck_assert_int_eq(c.pid, getpid());
		ck_assert_uint_eq(c.uid, getuid());
		ck_assert_uint_eq(c.gid, getgid());
	}
	close(sv[0]);
	close(sv[1]);
}
END_TEST

START_TEST(test_other_process)
{
	char dir[] = "/tmp/tkv-peercred-XXXXXX";
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	PeerCred c = { 0 };
	int lfd, cfd, status;
	pid_t child;
	char byte;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/sock", dir);
	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(lfd, 0);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(lfd, 1), 0);

	child = fork();
	ck_assert_int_ge(child, 0);
	if (child == 0) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		PeerCred me = { 0 };
		if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
			_exit(2);
		/* the child sees the listener's creds: the parent's pid */
		if (peercred_get(fd, &me) < 0 || me.pid != getppid())
			_exit(3);
		if (read(fd, &byte, 1) != 1) /* stay alive until the parent looked */
			_exit(4);
		_exit(0);
	}
	cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	ck_assert_int_ge(cfd, 0);
	ck_assert_int_eq(peercred_get(cfd, &c), 0);
	ck_assert_int_eq(c.pid, child);
	ck_assert_int_ne(c.pid, getpid());
	ck_assert_uint_eq(c.uid, getuid());
	ck_assert_uint_eq(c.gid, getgid());
	ck_assert_int_eq(write(cfd, "x", 1), 1);
	ck_assert_int_eq(waitpid(child, &status, 0), child);
	ck_assert(WIFEXITED(status));
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	close(cfd);
	close(lfd);
	unlink(sa.sun_path);
	rmdir(dir);
}
END_TEST

START_TEST(test_errors)
{
	PeerCred c = { .pid = 42 };
	int p[2], fd;

	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
	ck_assert_int_eq(peercred_get(p[0], &c), -ENOTSOCK);
	close(p[0]);
	close(p[1]);
	ck_assert_int_eq(peercred_get(p[0], &c), -EBADF);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(peercred_get(fd, &c), -ENOTCONN);
	close(fd);
	ck_assert_int_eq(c.pid, 42); /* untouched on failure */
}
END_TEST

int main(void)
{
	Suite *s = suite_create("peercred");
	TCase *tc = tcase_create("peercred");

	tcase_add_test(tc, test_socketpair);
	tcase_add_test(tc, test_other_process);
	tcase_add_test(tc, test_errors);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
