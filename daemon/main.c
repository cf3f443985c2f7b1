/*
 * main.c: turbokvd's entry point: settings, then the manager's story.
 */
#include <stdio.h>
#include <string.h>

#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/manager.h"

int main(int argc, char **argv)
{
	Config config = { 0 };
	Error err = { 0 };
	int r;

	log_setup(LOG_INFO);
	r = config_load(&config, argc, argv, &err);
	if (r != 0) {
		log_error("%s", err.msg);
		config_done(&config);
		return r == CONFIG_E_USAGE ? 2 : 1;
	}
	if (config.help || config.version) {
		if (config.help)
			config_usage();
		else
			printf("turbokvd %s\n", PACKAGE_VERSION);
		config_done(&config);
		return 0;
	}

	_cleanup_(manager_freep) Manager *m = NULL;
	if ((r = manager_new(&config, &m)) < 0) {
		log_error("out of memory");
	} else if ((r = manager_startup(m)) >= 0) {
		r = manager_run(m);
		manager_shutdown(m);
	}
	m = manager_free(m);
	config_done(&config);
	return r < 0 ? 1 : 0;
}
