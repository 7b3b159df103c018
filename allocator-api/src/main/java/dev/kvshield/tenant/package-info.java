/**
 * Tenants and owners. Every owned page has exactly one owner: a tenant plus a request, or a
 * tenant's cache namespace; readers of a page are always of the owner's tenant.
 */
package dev.kvshield.tenant;
